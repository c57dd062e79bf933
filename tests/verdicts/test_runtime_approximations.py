"""The bounds on llama.cpp's own rounding (tracediff/compare/approximations.py) hold, and a mistake exceeds them.

Each bound is checked against an emulation of ggml's CPU kernel in numpy, step for step as ggml-cpu runs it
(``ggml_compute_forward_flash_attn_ext_f16``: Q rounded to float16, K and V read in float16, an online softmax
in float32, ``sum_j p_j v_j`` kept in a float16 accumulator; the GELU read from a float16 table), against the
exact float64 result on the unrounded inputs. Why they hold on any x86-64 CPU: numpy's float16 rounding is
IEEE round to nearest, as F16C and ggml's software conversion are; AVX2, AVX-512 and AMX only reorder
float32 sums, and the bounds carry Higham's gamma_n for any order of n terms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from tracediff.compare.approximations import flash_attention_bound, geglu_bound, gelu_table_bound

F16, F32 = np.float16, np.float32


def exact_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, keys: int) -> np.ndarray:
    """Causal attention in float64: query t of the last ``tokens`` attends keys 0 .. keys - tokens + t."""
    heads, tokens, _ = q.shape
    group = heads // k.shape[0]
    out = np.zeros((tokens, heads, v.shape[2]))
    for h in range(heads):
        for t in range(tokens):
            seen = keys - tokens + t + 1
            s = scale * (k[h // group, :seen].astype(np.float64) @ q[h, t].astype(np.float64))
            p = np.exp(s - s.max())
            out[t, h] = p @ v[h // group, :seen].astype(np.float64) / p.sum()
    return out


def ggml_flash_attention(q: np.ndarray, k16: np.ndarray, v16: np.ndarray, scale: float, keys: int) -> np.ndarray:
    """ggml-cpu's float16 flash attention, one query row at a time, as its kernel runs it."""
    heads, tokens, _ = q.shape
    group = heads // k16.shape[0]
    q16 = q.astype(F16)
    out = np.zeros((tokens, heads, v16.shape[2]), dtype=F32)
    for h in range(heads):
        for t in range(tokens):
            acc = np.zeros(v16.shape[2], dtype=F16)  # VKQ16
            big, total = F32(-np.inf), F32(0)
            for j in range(keys - tokens + t + 1):
                s = F32(np.dot(q16[h, t].astype(F32), k16[h // group, j].astype(F32))) * F32(scale)
                old = big
                ms, vs = F32(1), F32(1)
                if s > big:
                    big = s
                    ms = F32(np.exp(old - big))
                    acc = (acc.astype(F32) * ms).astype(F16)  # ggml_vec_scale_f16
                else:
                    vs = F32(np.exp(s - big))
                acc = (acc.astype(F32) + v16[h // group, j].astype(F32) * vs).astype(F16)  # ggml_vec_mad_f16
                total = total * ms + vs
            out[t, h] = acc.astype(F32) / total
    return out


@pytest.mark.parametrize(("seed", "magnitude", "scale", "kv_heads"),
                         [(0, 1.0, 0.25, 2), (1, 3.0, 0.25, 4), (2, 0.5, 1.0, 1), (3, 2.0, 0.0625, 2)])
def test_flash_attention_bound_holds(seed: int, magnitude: float, scale: float, kv_heads: int) -> None:
    rng = np.random.default_rng(seed)
    heads, tokens, cells, dim, keys = 4, 8, 16, 16, 8  # a cache of 16 cells, 8 filled (the rest zero)
    q = (rng.standard_normal((heads, tokens, dim)) * magnitude).astype(F32)
    k = np.zeros((kv_heads, cells, dim), dtype=F32)
    v = np.zeros((kv_heads, cells, dim), dtype=F32)
    k[:, :keys] = rng.standard_normal((kv_heads, keys, dim)) * magnitude
    v[:, :keys] = rng.standard_normal((kv_heads, keys, dim))
    k16, v16 = k.astype(F16), v.astype(F16)
    error = np.abs(ggml_flash_attention(q, k16, v16, scale, keys) - exact_attention(q, k, v, scale, keys))
    bound = flash_attention_bound(q, k16, v16, scale=scale)
    assert bound.shape == error.shape
    assert (error <= bound).all(), float((error / bound).max())
    assert error.max() > 0  # the kernel did round: the bound is not vacuous


def test_a_wrong_attention_exceeds_the_bound() -> None:
    """A mistake of the attention (scores scaled by 1.25, a wrong head scale) stands out of the bound."""
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 8, 16)).astype(F32)
    k = rng.standard_normal((2, 8, 16)).astype(F32)
    v = rng.standard_normal((2, 8, 16)).astype(F32)
    k16, v16 = k.astype(F16), v.astype(F16)
    wrong = ggml_flash_attention(q, k16, v16, 0.25 * 1.25, 8)
    assert (np.abs(wrong - exact_attention(q, k, v, 0.25, 8)) > flash_attention_bound(q, k16, v16, scale=0.25)).any()


def gelu(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


def ggml_gelu(x: np.ndarray) -> np.ndarray:
    """ggml-cpu's GELU with GGML_GELU_FP16: the float16 table at the float16 of x, 0 or x outside (-10, 10)."""
    x = x.astype(F32)
    table = gelu(x.astype(F16).astype(F32)).astype(F32).astype(F16).astype(F32)
    return np.where(x <= -10, F32(0), np.where(x >= 10, x, table))


def test_gelu_table_bound_holds() -> None:
    x = np.concatenate([np.linspace(-12, 12, 20001), np.random.default_rng(0).standard_normal(4096) * 3,
                        np.geomspace(1e-9, 1e-3, 200), -np.geomspace(1e-9, 1e-3, 200)]).astype(F32)
    error = np.abs(ggml_gelu(x) - gelu(x))
    assert (error <= gelu_table_bound(x)).all()
    assert error.max() > 0


def test_geglu_bound_holds_and_a_swap_exceeds_it() -> None:
    rng = np.random.default_rng(1)
    gate, up = (rng.standard_normal(4096) * 2).astype(F32), (rng.standard_normal(4096) * 2).astype(F32)
    exact = gelu(gate) * up.astype(np.float64)
    assert (np.abs(ggml_gelu(gate) * up - exact) <= geglu_bound(gate, up)).all()
    # gate and up written in each other's place differ by O(1), the bound by a float16 rounding
    assert (np.abs(ggml_gelu(up) * gate - exact) > geglu_bound(gate, up)).any()
