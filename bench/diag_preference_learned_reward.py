"""Diagnostic: the learned reward of a finished ``demo preferences --env brax:inverted_pendulum`` run, on the
upright steps of its final agent's samples (30% random-action exploration): mean and std per seed, against the
absorbing steps, and its correlation with each observation dimension (brax: cart x, pole angle, cart velocity,
pole angular velocity) and their magnitudes. The true reward is 1 on every upright step.

Run ``python bench/diag_preference_learned_reward.py OUT`` with OUT the demo's ``--out`` folder (default settings;
it loads the last checkpoint, recompiling the loop once).
"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jaxweight.demos import preferences as demo
from jaxweight.preference.loop import learned_reward_fn, AgentReward

out = sys.argv[1]
s = demo.settings("brax:inverted_pendulum")
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
