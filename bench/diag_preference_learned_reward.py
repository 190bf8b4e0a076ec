"""Diagnostic: the learned reward of a finished ``demo preferences --env brax:inverted_pendulum`` run, on the
upright steps of its final agent's samples (30% random-action exploration): mean and std per seed, against the
absorbing steps, and its correlation with each observation dimension (brax: cart x, pole angle, cart velocity,
pole angular velocity) and their magnitudes. The true reward is 1 on every upright step. Then the absorbing
steps' learned reward by the sign of the terminal pole angle and angular velocity (does falling one way pay?).

With ``--fresh-agent STEPS``: a fresh PPO agent per seed (the demo's settings) trained for STEPS on the FINAL
learned reward, fixed instead of changing every round; its true return (16 episodes, sampled and greedy) at four
points, against the loop's own agent's last evaluation. Separates "the reward is wrong" from "the reward moves".

Run ``python bench/diag_preference_learned_reward.py OUT [--fresh-agent STEPS]`` with OUT the demo's ``--out``
folder (default settings; it loads the last checkpoint, recompiling the loop once).
"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from jaxweight.demos import preferences as demo
from jaxweight.preference.loop import learned_reward_fn, AgentReward

out = sys.argv[1]
fresh = int(sys.argv[sys.argv.index("--fresh-agent") + 1]) if "--fresh-agent" in sys.argv else None
s = demo.settings("brax:inverted_pendulum", agent="ppo")  # the PPO run this diagnosis is of
pc = demo.build(s)
pc.train(0, s.total_timesteps, s.total_comparisons, num_seeds=s.seeds, checkpoint_dir=f"{out}/checkpoints/brax-inverted_pendulum", resume=True)
st = pc.state
gen = pc.generator
rf = learned_reward_fn(pc.reward_module, pc.ensemble)
rp = AgentReward(st.reward.params, jnp.zeros((s.seeds,)), st.reward_shift, st.reward_scale)

def one(gs, rp, key):
    t = gen.replace(exploration_frac=0.3).sample(gs, key, 20000)
    o, a = t.obs, t.acts
    r = jax.vmap(jax.vmap(lambda ob, ac, nob: rf(rp, ob, ac, nob, jnp.asarray(False))))(o[:, :-1], a, o[:, 1:])
    return r, o[:, :-1], t.rews

r, o, tr = jax.jit(jax.vmap(one))(st.gen, rp, jax.random.split(jax.random.key(7), s.seeds))
r, o, tr = np.asarray(r), np.asarray(o), np.asarray(tr)
print("obs dims", o.shape[-1])
for i in range(s.seeds):
    live = tr[i] > 0.5
    rl, ol = r[i][live], o[i][live]
    cs = [np.corrcoef(rl, ol[:, d])[0, 1] for d in range(ol.shape[1])]
    ca = [np.corrcoef(rl, np.abs(ol[:, d]))[0, 1] for d in range(ol.shape[1])]
    print(f"seed {i}: live steps {live.sum()}, reward mean {rl.mean():.2f} std {rl.std():.2f} (absorbing {r[i][~live].mean():.2f}); "
          f"corr with obs dims {np.round(cs, 2).tolist()}; with |obs| {np.round(ca, 2).tolist()}")
print("absorbing steps: learned reward by the sign of the terminal pole angle and angular velocity")
for i in range(s.seeds):
    dead = tr[i] < 0.5
    ra, oa = r[i][dead], o[i][dead]
    pos, wpos = oa[:, 1] > 0, oa[:, 3] > 0
    print(f"seed {i}: absorbing steps {dead.sum()}, reward mean {ra.mean():.2f} std {ra.std():.2f}; angle > 0: "
          f"{ra[pos].mean():.2f} (n {pos.sum()}), <= 0: {ra[~pos].mean():.2f}; angular velocity > 0: "
          f"{ra[wpos].mean():.2f}, <= 0: {ra[~wpos].mean():.2f}")

if fresh:
    chunks = 4

    def fresh_run(key, rp):
        k0, k1 = jax.random.split(key)

        def body(g, k):
            g = gen.train(g, k, fresh // chunks, rp)
            ka, kb = jax.random.split(k)
            return g, (jnp.mean(gen.evaluate(g, ka, 16)), jnp.mean(gen.evaluate(g, kb, 16, deterministic=True)))

        return jax.lax.scan(body, gen.init(k0), jax.random.split(k1, chunks))[1]

    t0 = time.perf_counter()
    sto, gre = jax.jit(jax.vmap(fresh_run))(jax.random.split(jax.random.key(11), s.seeds), rp)
    print(json.dumps(dict(fresh_agent_steps=fresh, points=[fresh // chunks * (j + 1) for j in range(chunks)],
                          sampled=np.asarray(sto).tolist(), greedy=np.asarray(gre).tolist(),
                          loop_last_round=np.asarray(pc.history[-1]["gt_return"]).tolist(),
                          wall_s=time.perf_counter() - t0)))
