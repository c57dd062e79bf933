"""Bounds on what a runtime's own rounding does to a node's output, derived from the node's recorded inputs.

Two of ggml's CPU kernels round on purpose: flash attention (below) and the GELU through a float16 table
(:func:`gelu_table_bound`, :func:`geglu_bound`).

ggml's CPU flash attention (``FLASH_ATTN_EXT``) with K and V in float16 (an F16 cache, or the float16 copy
ggml makes of an F32 cache's views) computes, per query row i, head h and value column d,
``o = sum_j p_j v_j / sum_j p_j`` with ``p_j = exp(s_j - max s)`` and ``s_j = scale * q . k_j`` (or
``softcap * tanh(s_j / softcap)``), where it rounds q to float16 (K's dot type), reads k and v in float16,
and accumulates ``sum_j p_j v_j`` in a float16 accumulator (``ggml_vec_mad_f16``, ``ggml_vec_scale_f16``:
one rounding per update, at most two per key). With the float16 unit roundoff ``u = 2**-11`` (round to
nearest: F16C's ``vcvtps2ph`` and ggml's software conversion both do), a rounding error of at most
``u |x| + eta`` (``eta = 2**-25``, float16's subnormal step) and float32's ``u32 = 2**-24``:

* each score moves by at most ``delta_i = scale * sum_e ((2u + u^2) |q_e| |k_e| + eta (|q_e| + |k_e|))``
  plus float32's dot-product error ``gamma32(D) sum_e |q_e||k_e|`` (``gamma(n) = n u / (1 - n u)``); tanh's
  softcap is 1-Lipschitz and keeps the bound;
* the normalised weights then move by a factor within ``exp(+-2 delta_i)`` (times float32 ``expf``'s error,
  at most 4 ulps each side), so the output moves by at most ``(exp(2 delta_i) - 1) sum_j p_j |v_j|``;
* v's rounding adds ``u sum_j p_j |v_j|`` (plus ``eta``), the float16 accumulation over ``n`` keys
  ``gamma16(2n) sum_j p_j |v_j|`` (plus ``2n eta``), the final float32 division ``gamma32(n + 1)``.

``sum_j p_j |v_j| <= max_j |v_jd|`` over every key of the view (a superset of the keys attended), so the
bound needs neither the mask nor the probabilities: ``E = ((exp(2 delta) (1 + 4 u32)^2 (1 + u)
(1 + gamma16(2n)) (1 + gamma32(n + 1))) - 1) max_j |v_jd| + (2n + 2) eta``. ``n`` is the number of keys
that hold a value: llama.cpp clears its cache buffers to zero, and a key whose k and v are both zero adds
nothing to the accumulator. Every step is an upper bound of the IEEE rounding on any x86-64 CPU (AVX2,
AVX-512, AMX alike: they change how the float32 sums are ordered, covered by ``gamma32``, never the
float16 rounding). The derivation is in docs/verdicts.md.
"""

from __future__ import annotations

import math

import numpy as np

U16 = 2.0 ** -11  # float16's unit roundoff
ETA16 = 2.0 ** -25  # half of float16's smallest subnormal step: the absolute error of rounding below 2**-14
U32 = 2.0 ** -24


def gamma(n: int, u: float) -> float:
    """Higham's ``gamma_n = n u / (1 - n u)``: the relative error bound of n roundings in a row."""
    return n * u / (1 - n * u) if n * u < 1 else math.inf


def flash_attention_bound(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, scale: float) -> np.ndarray:
    """The largest error ggml's float16 flash attention can make at each output element (see the module).

    ``q`` ``[heads, tokens, dk]``, ``k`` ``[kv heads, keys, dk]``, ``v`` ``[kv heads, keys, dv]`` (the node's
    inputs in torch's order, as recorded); returns ``[tokens, heads, dv]``, the node's output layout.
    """
    q, k, v = (np.abs(np.asarray(x, dtype=np.float64)) for x in (q, k, v))
    heads, kv_heads, dk = q.shape[0], k.shape[0], q.shape[2]
    group = heads // kv_heads  # grouped-query attention: query head h reads key/value head h // group
    k_up, v_up = (np.repeat(x, group, axis=0) for x in (k, v))
    # |x| <= |fl(x)| / (1 - u) + eta: k and v are recorded after their rounding
    k_up = (k_up + ETA16) / (1 - U16)
    dots = np.einsum("hte,hke->htk", q, k_up)  # sum_e |q_e| |k_e|
    sums = q.sum(axis=2)[:, :, None] + k_up.sum(axis=2)[:, None, :]
    delta = abs(scale) * ((2 * U16 + U16 ** 2 + gamma(dk, U32)) * dots + ETA16 * sums).max(axis=2)  # [h, t]
    keys = int(np.count_nonzero((k != 0).any(axis=(0, 2)) | (v != 0).any(axis=(0, 2))))
    factor = (np.exp(2 * delta) * (1 + 4 * U32) ** 2 * (1 + U16) * (1 + gamma(2 * keys, U16))
              * (1 + gamma(keys + 1, U32))) - 1
    largest_v = (v_up.max(axis=1) + ETA16) / (1 - U16)  # [h, dv]
    bound = factor[:, :, None] * largest_v[:, None, :] + (2 * keys + 2) * ETA16  # [h, t, dv]
    return np.ascontiguousarray(bound.transpose(1, 0, 2))


# sup |d/dx gelu(x)| for the tanh form ggml tabulates (1.1289 near x = 1.5), rounded up
GELU_SLOPE = 1.13


def gelu_table_bound(x: np.ndarray) -> np.ndarray:
    """The largest error of ggml's CPU GELU at each element of its input ``x`` (float32).

    ggml-cpu is built with ``GGML_GELU_FP16``: for ``-10 < x < 10`` it returns ``table[fp16(x)]``, the float16
    of gelu at the float16 of x (computed with float32's ``tanhf``). Rounding x moves gelu by at most
    ``GELU_SLOPE (u |x| + eta)``, storing it rounds once more: ``u |gelu| + eta``, with ``|gelu| <= |x|``;
    ``tanhf``'s float32 error adds at most ``8 u32 |x|``. Outside (-10, 10) ggml returns 0 or x, within
    ``1e-21 |x|`` of gelu.
    """
    x = np.abs(np.asarray(x, dtype=np.float64))
    return GELU_SLOPE * (U16 * x + ETA16) + (U16 + 8 * U32) * x + ETA16 + 1e-21 * x


def geglu_bound(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """ggml's CPU GEGLU ``gelu(gate) * up`` (the GELU through the float16 table): the table's error times
    ``|up|``, and the float32 product's rounding. The node does not record which input it activates (ggml's
    ``swapped``), so the larger of both readings is taken."""
    gate, up = (np.asarray(t, dtype=np.float64) for t in (gate, up))

    def reading(activated: np.ndarray, other: np.ndarray) -> np.ndarray:
        return gelu_table_bound(activated) * np.abs(other) * (1 + U32) + 2 * U32 * np.abs(activated * other)

    return np.maximum(reading(gate, up), reading(up, gate))
