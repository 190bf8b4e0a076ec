"""A small causal transformer (flax linen) with KV-cache sampling inside ``lax.scan``.

``TinyLM`` is a pre-LayerNorm decoder: token + learned absolute position
embeddings, ``n_layers`` blocks of causal multi-head attention and a GELU MLP,
a final LayerNorm and an untied output projection. Attention ignores the
left padding of the prompts (``PAD`` keys are masked).

* ``model.apply(params, tokens)`` -> logits ``f32[N, T, V]`` (teacher forcing);
* :func:`sequence_logp` -> log-probs of given completion tokens (:func:`sequence_logp_entropy`:
  and the policy's entropy at each position);
* :func:`sample` -> completions drawn with an explicit key and a temperature,
  one prefill of the prompt into a KV cache and then one cached decoding step
  per token in ``lax.scan``; returns the tokens, their log-probs under the
  distribution they were drawn from (``logits / temperature``), the policy's
  token entropy and a mask.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from ._task import EOS, PAD, VOCAB_SIZE

__all__ = ["TinyLM", "Samples", "sample", "sequence_logp", "sequence_logp_entropy", "completion_mask"]

_NEG = -1e9


def _no_pad(logits):
    """The policy never emits PAD (it only fills the space after EOS)."""
    return jnp.where(jnp.arange(logits.shape[-1]) == PAD, _NEG, logits)


class _Block(nn.Module):
    d_model: int
    n_heads: int
    d_ff: int

    def setup(self):
        self.ln1 = nn.LayerNorm()
        self.qkv = nn.Dense(3 * self.d_model)
        self.proj = nn.Dense(self.d_model)
        self.ln2 = nn.LayerNorm()
        self.ff1 = nn.Dense(self.d_ff)
        self.ff2 = nn.Dense(self.d_model)

    def _split(self, x):
        n, t, _ = x.shape
        q, k, v = jnp.split(self.qkv(self.ln1(x)), 3, axis=-1)
        h = self.n_heads
        return (q.reshape(n, t, h, -1), k.reshape(n, t, h, -1), v.reshape(n, t, h, -1))

    def _attend(self, q, k, v, mask):
        # q [N,Tq,H,D], k/v [N,Tk,H,D], mask bool[N,Tq,Tk]
        s = jnp.einsum("nqhd,nkhd->nhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
        s = jnp.where(mask[:, None], s, _NEG)
        a = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("nhqk,nkhd->nqhd", a, v)
        return o.reshape(o.shape[0], o.shape[1], -1)

    def _mlp(self, x):
        return x + self.ff2(nn.gelu(self.ff1(self.ln2(x))))

    def __call__(self, x, mask):
        q, k, v = self._split(x)
        x = x + self.proj(self._attend(q, k, v, mask))
        return self._mlp(x), (k, v)

    def step(self, x, cache_k, cache_v, pos, mask):
        """One cached position: x [N,1,D]; cache [N,T,H,D]; mask bool[N,1,T]."""
        q, k, v = self._split(x)
        cache_k = jax.lax.dynamic_update_slice_in_dim(cache_k, k, pos, axis=1)
        cache_v = jax.lax.dynamic_update_slice_in_dim(cache_v, v, pos, axis=1)
        x = x + self.proj(self._attend(q, cache_k, cache_v, mask))
        return self._mlp(x), cache_k, cache_v


class TinyLM(nn.Module):
    """Decoder-only transformer over the task's character vocabulary.

    Attributes:
      vocab_size, d_model, n_layers, n_heads, d_ff, max_len: sizes.
    """

    vocab_size: int = VOCAB_SIZE
    d_model: int = 128
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 512
    max_len: int = 16

    def setup(self):
        self.embed = nn.Embed(self.vocab_size, self.d_model)
        self.pos = self.param("pos", nn.initializers.normal(0.02), (self.max_len, self.d_model))
        self.blocks = [_Block(self.d_model, self.n_heads, self.d_ff) for _ in range(self.n_layers)]
        self.ln_f = nn.LayerNorm()
        self.head = nn.Dense(self.vocab_size)

    def __call__(self, tokens):
        """tokens i32[N, T] -> logits f32[N, T, V] (causal; PAD keys of the prompt masked)."""
        logits, _ = self.prefill(tokens)
        return logits

    def prefill(self, tokens):
        """Logits of every position and the per-layer keys/values ``[N, T, H, D]``."""
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos[:t]
        causal = jnp.tril(jnp.ones((t, t), bool))
        mask = causal[None] & (tokens != PAD)[:, None, :]
        # a fully padded row attends to itself so softmax stays finite
        mask = mask | jnp.eye(t, dtype=bool)[None]
        kv = []
        for blk in self.blocks:
            x, c = blk(x, mask)
            kv.append(c)
        return _no_pad(self.head(self.ln_f(x))), kv

    def decode(self, token, pos, cache, key_valid):
        """One token at position ``pos``: token i32[N], cache list of (k, v) [N, T, H, D].

        ``key_valid``: bool[N, T] keys that may be attended to (prompt non-PAD
        and completion positions written so far, ``pos`` included).
        """
        x = self.embed(token[:, None]) + jax.lax.dynamic_slice_in_dim(self.pos, pos, 1)[None]
        mask = key_valid[:, None, :]
        new = []
        for blk, (ck, cv) in zip(self.blocks, cache):
            x, ck, cv = blk.step(x, ck, cv, pos, mask)
            new.append((ck, cv))
        return _no_pad(self.head(self.ln_f(x)))[:, 0], new


@flax.struct.dataclass
class Samples:
    """Completions drawn by :func:`sample`.

    Attributes:
      tokens: i32[N, L] sampled tokens (PAD after EOS).
      logp: f32[N, L] log-prob of each token under the distribution it was sampled from
        (``softmax(logits / temperature)``; greedy: temperature 1), 0 where masked.
      entropy: f32[N, L] entropy of the policy (temperature 1) at each position, 0 where masked.
      mask: bool[N, L] tokens up to and including the first EOS.
    """

    tokens: jax.Array
    logp: jax.Array
    entropy: jax.Array
    mask: jax.Array


def completion_mask(tokens: jax.Array) -> jax.Array:
    """bool[N, L]: positions up to and including the first EOS."""
    is_eos = tokens == EOS
    before = jnp.cumsum(is_eos, axis=-1) - is_eos  # EOS seen strictly before
    return before == 0


def sample(model: TinyLM, params, prompts: jax.Array, key: jax.Array, length: int,
           temperature: jax.Array | float = 1.0, greedy: bool = False) -> Samples:
    """Sample ``length`` completion tokens for each prompt (KV cache, ``lax.scan``).

    Args:
      model: the module; params: its variables.
      prompts: i32[N, Lp] left-padded prompts.
      key: PRNG key (one draw per position, split inside).
      length: static completion length L.
      temperature: f32[] sampling temperature (traced; > 0).
      greedy: static; take the most likely token instead (evaluation).

    Returns:
      :class:`Samples` with ``tokens i32[N, L]``, ``logp f32[N, L]``, ``entropy f32[N, L]``, ``mask bool[N, L]``.
    """
    n, lp = prompts.shape
    total = lp + length
    padded = jnp.concatenate([prompts, jnp.full((n, length), PAD, prompts.dtype)], axis=1)
    logits, kv = model.apply(params, padded[:, :lp], method=TinyLM.prefill)
    h = kv[0][0].shape[2]
    dh = kv[0][0].shape[3]
    cache = [(jnp.zeros((n, total, h, dh), k.dtype).at[:, :lp].set(k),
              jnp.zeros((n, total, h, dh), v.dtype).at[:, :lp].set(v)) for k, v in kv]
    key_valid = jnp.concatenate([prompts != PAD, jnp.zeros((n, length), bool)], axis=1)
    temp = jnp.asarray(temperature, jnp.float32)

    def draw(logits, k, done):
        logits = logits.astype(jnp.float32)
        lsm = jax.nn.log_softmax(logits, axis=-1)
        ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
        if greedy:
            tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            lsm_s = lsm
        else:
            # the log-prob recorded is that of the distribution the token is drawn from
            lsm_s = jax.nn.log_softmax(logits / temp, axis=-1)
            tok = jax.random.categorical(k, lsm_s, axis=-1).astype(jnp.int32)
        lp_ = jnp.take_along_axis(lsm_s, tok[:, None], axis=-1)[:, 0]
        tok = jnp.where(done, PAD, tok)
        return tok, jnp.where(done, 0.0, lp_), jnp.where(done, 0.0, ent), ~done

    keys = jax.random.split(key, length)
    tok0, lp0, e0, m0 = draw(logits[:, -1], keys[0], jnp.zeros((n,), bool))
    done0 = tok0 == EOS

    def body(carry, xs):
        tok, done, cache, key_valid = carry
        j, k = xs
        pos = lp + j
        key_valid = key_valid.at[:, pos].set(True)
        lg, cache = model.apply(params, tok, pos, cache, key_valid, method=TinyLM.decode)
        new, lpn, en, m = draw(lg, k, done)
        return (new, done | (new == EOS), cache, key_valid), (new, lpn, en, m)

    if length > 1:
        _, (toks, lps, ents, ms) = jax.lax.scan(body, (tok0, done0, cache, key_valid),
                                                (jnp.arange(length - 1), keys[1:]))
        cat = lambda x0, xs: jnp.concatenate([x0[:, None], xs.T], axis=1)  # noqa: E731
        toks, lps, ents, ms = cat(tok0, toks), cat(lp0, lps), cat(e0, ents), cat(m0, ms)
    else:
        toks, lps, ents, ms = tok0[:, None], lp0[:, None], e0[:, None], m0[:, None]
    return Samples(tokens=toks, logp=lps, entropy=ents, mask=ms)


def _teacher_forced(model: TinyLM, params, prompts: jax.Array, completions: jax.Array,
                    temperature: jax.Array | float) -> tuple[jax.Array, jax.Array]:
    """``(log_softmax(logits / temperature) f32[N, L, V], logits f32[N, L, V])`` at the completion positions."""
    lp = prompts.shape[1]
    seq = jnp.concatenate([prompts, completions], axis=1)
    logits = model.apply(params, seq[:, :-1])[:, lp - 1:].astype(jnp.float32)
    return jax.nn.log_softmax(logits / jnp.asarray(temperature, jnp.float32), axis=-1), logits


def sequence_logp(model: TinyLM, params, prompts: jax.Array, completions: jax.Array,
                  temperature: jax.Array | float = 1.0) -> jax.Array:
    """f32[N, L] log-prob of each completion token given the prompt (teacher forcing).

    ``temperature``: the log-probs of ``softmax(logits / temperature)``, the distribution
    :func:`sample` draws from at that temperature.
    """
    logp, _ = _teacher_forced(model, params, prompts, completions, temperature)
    return jnp.take_along_axis(logp, completions[..., None], axis=-1)[..., 0]


def sequence_logp_entropy(model: TinyLM, params, prompts: jax.Array, completions: jax.Array,
                          temperature: jax.Array | float = 1.0) -> tuple[jax.Array, jax.Array]:
    """``(logp f32[N, L], entropy f32[N, L])``: :func:`sequence_logp` and the policy's entropy
    (temperature 1) at each completion position, differentiable (a token-entropy bonus)."""
    logp, logits = _teacher_forced(model, params, prompts, completions, temperature)
    lsm = jax.nn.log_softmax(logits, axis=-1)
    ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
    return jnp.take_along_axis(logp, completions[..., None], axis=-1)[..., 0], ent
