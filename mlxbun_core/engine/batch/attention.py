"""Attention that reads a row's KV straight from its blocks (short queries on CUDA).

The portable path (``view.PagedLayer`` by default) gathers every row's blocks into a
dense ``(rows, heads, keys, dim)`` array and hands it to the model's attention: plain
MLX ops on every backend, but each pass copies the batch's KV once more and reads
past each row's end up to the longest row. For decode steps and short windows (a
speculative verify, a forced run) on CUDA, :func:`paged_attention` runs a kernel of our
own (``mx.fast.cuda_kernel``) that walks each row's block table and reads only that
row's keys and values, once per KV head for all the query heads that share it: no
gather, no padded positions, and no cuDNN graph built per new shape.

It reaches the model the only way mlx-lm leaves open: the model calls
``mx.fast.scaled_dot_product_attention`` (through ``mlx_lm.models.base``) with the keys
and values its cache object returned. In direct mode the cache object returns its
store's own arrays and notes the pass; :func:`install` wraps MLX's attention function
once per process, and the wrapper sends a call carrying a noted store to
:func:`paged_attention`, every other call to MLX. Whether a model may run direct is
decided by a probe at the batch's start (``probe``): one small pass both ways, compared.

``paged_reference`` is the same contract in plain MLX ops: the CPU tests check the
dispatch with it, and the GPU benchmark checks the kernel against it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Protocol, cast

import mlx.core as mx

from . import flash

if TYPE_CHECKING:
    import numpy as np

    from .storage import LayerStore


class Window(Protocol):
    """What attention reads of a pass's tables (``view.Window``, which imports this
    module: so a protocol here, not an import)."""

    blocks: mx.array  # (rows, n) block tables
    offset: mx.array  # (rows,) each row's first query position
    starts: np.ndarray  # the same on the host
    width: int
    kernel_consts: dict[Any, list[mx.array]]  # the kernel's constant inputs, per pass

    def mask(self, window: int | None = None) -> mx.array: ...

log = logging.getLogger("mlxbun.engine")

# "auto": the kernel on CUDA, the gathered path elsewhere; "kernel" / "reference": direct
# mode with the kernel or with plain ops (tests and benchmarks); "gather": never direct
MODE = "auto"
MAX_QUERY = 16  # window positions the kernel takes; longer passes gather (prefill chunks)
SHARED_FLOATS = 8192  # the kernel's per-warp partial results fit 32 KB of shared memory
# the kernel: "splitk" (below), or "flash" (flash.py: tiles in shared memory; faulted on
# its first device run, so not the default until a sitting finds why)
KERNEL = "splitk"

_local = threading.local()  # the pass's noted stores: id(keys array) -> (store, view, window)
_kernels: dict[tuple[Any, ...], Any] = {}  # the compiled kernels, by dtype and shape


def note(keys: mx.array, store: LayerStore, view: Window, window: int | None) -> None:
    """Mark ``keys`` (a store's own array, returned by a cache object in direct mode)."""
    noted = getattr(_local, "noted", None)
    if noted is None:
        noted = _local.noted = {}
    noted[id(keys)] = (keys, store, view, window)


def _take(keys: mx.array) -> tuple[LayerStore, Window, int | None] | None:
    noted = getattr(_local, "noted", None)
    got = noted.pop(id(keys), None) if noted else None
    if got is None or got[0] is not keys:
        return None
    return got[1], got[2], got[3]


def install() -> None:
    """Make MLX's attention function ours, outermost (idempotent: another wrapper
    installed since, such as ``engine/attention_route.py``, is wrapped in turn)."""
    current = mx.fast.scaled_dot_product_attention
    if getattr(current, "mlxbun_paged", False):
        return

    def attention(q: mx.array, k: mx.array, v: mx.array, *args: Any, **kw: Any) -> mx.array:
        noted = _take(k)
        if noted is None:
            return current(q, k, v, *args, **kw)
        store, view, window = noted
        scale = kw.get("scale", args[0] if args else 1.0)
        return paged_attention(q, store, view, window, float(scale), use_kernel())

    attention.mlxbun_paged = True  # type: ignore[attr-defined]  # marks our wrapper
    mx.fast.scaled_dot_product_attention = attention


def wanted() -> bool:
    """Whether batches should try direct mode in this process."""
    return MODE in ("kernel", "reference") or (MODE == "auto" and cuda_ready())


def cuda_ready() -> bool:
    """Whether this process runs MLX on a CUDA device."""
    cuda = getattr(mx, "cuda", None)
    return bool(cuda is not None and cuda.is_available() and mx.default_device() == mx.gpu)


def use_kernel() -> bool:
    return MODE == "kernel" or (MODE == "auto" and cuda_ready())


def direct_fits(store: LayerStore, width: int) -> bool:
    """Whether a pass of ``width`` over ``store``'s layer runs direct (the kernels take
    head dims in multiples of 32, the same for keys and values; where the flash kernel's
    tiles do not fit its shared memory, :func:`paged_attention` runs the reference)."""
    k, v = store.keys, store.values
    if k is None or v is None or width > MAX_QUERY:
        return False
    if not use_kernel():
        return True
    dim = k.shape[-1]
    return (v.shape[-1] == dim and dim % 32 == 0
            and k.dtype in (mx.float16, mx.bfloat16, mx.float32))


def paged_attention(q: mx.array, store: LayerStore, view: Window, window: int | None,
                    scale: float, use_kernel: bool) -> mx.array:
    """Attention of queries ``q`` (``(rows, q_heads, width, dim)``) over the rows' blocks
    of ``store``: query ``i`` of row ``r`` sees positions ``<= start[r] + i`` (and,
    with ``window``, the last ``window`` of them)."""
    if not use_kernel:
        return paged_reference(q, store, view, window, scale)
    if KERNEL == "flash":
        keys = store.keys
        assert keys is not None
        if flash.tile_for(q.shape[-1], keys.dtype.size, q.shape[1] // keys.shape[1]):
            return flash.flash_attention(q, store, view, window, scale)
        return paged_reference(q, store, view, window, scale)
    return _splitk_attention(q, store, view, window, scale)


def paged_reference(q: mx.array, store: LayerStore, view: Window, window: int | None,
                    scale: float) -> mx.array:
    """:func:`paged_attention` in plain MLX ops: gather, mask, softmax in float32."""
    keys, values = store.gather(view.blocks)
    rows, heads, width, dim = q.shape
    rep = heads // keys.shape[1]
    qf = (q.astype(mx.float32) * scale).reshape(rows, keys.shape[1], rep, width, dim)
    scores = qf @ keys.astype(mx.float32)[:, :, None].swapaxes(-1, -2)
    mask = view.mask(window)[:, :, None]  # (rows, 1, 1, width, keys)
    scores = mx.where(mask, scores, -mx.inf)
    probs = mx.softmax(scores, axis=-1)
    out = probs @ values.astype(mx.float32)[:, :, None]
    return out.reshape(rows, heads, width, -1).astype(q.dtype)


# One thread block per (row, KV head, query position, split of the keys): its warps walk
# the split's keys (a key per warp at a time, each lane holding D/32 of the head dims for
# every query head sharing the KV head), keep an online softmax, and leave the split's
# (max, sum, weighted values); plain ops combine the splits. Splitting the keys keeps the
# device busy when there are few rows (a lone long stream) as well as many.
_SOURCE = """
    constexpr int PER = D / 32;
""" + flash.BLOCK_SPAN + """
    const float sc = scale[0];
    float qv[R][PER], acc[R][PER], m[R], l[R];
    for (int r = 0; r < R; ++r) {
        const T* qp = q + (((size_t)(b * HQ + hkv * R + r) * W + wi) * D) + lane * PER;
        for (int i = 0; i < PER; ++i) {
            qv[r][i] = static_cast<float>(qp[i]) * sc;
            acc[r][i] = 0.f;
        }
        m[r] = -INFINITY; l[r] = 0.f;
    }
    // a warp takes G keys at a time: their loads, dot products and shuffles are
    // independent of each other (latency hidden), the running softmax corrected once
    for (int j0 = lo + warp * G; j0 <= hi; j0 += WARPS * G) {
        float kk[G][PER], vv[G][PER];
        bool in[G];
        for (int g = 0; g < G; ++g) {
            in[g] = j0 + g <= hi;
            const int j = in[g] ? j0 + g : j0;  // (a key past the split: read, not counted)
            const size_t slot = (size_t)blocks[b * NB + j / BS] * BS + (j % BS);
            const T* kp = k + (slot * HKV + hkv) * D + lane * PER;
            const T* vp = v + (slot * HKV + hkv) * D + lane * PER;
            if constexpr (VEC && PER % 4 == 0 && sizeof(T) == 2) {
                for (int i = 0; i < PER; i += 4) {  // 8 bytes a load, copied, not punned
                    const uint2 kw = *reinterpret_cast<const uint2*>(kp + i);
                    const uint2 vw = *reinterpret_cast<const uint2*>(vp + i);
                    T kt[4], vt[4];  // (byte copies: char may alias; NVRTC has no memcpy)
                    for (int e = 0; e < 8; ++e) {
                        reinterpret_cast<unsigned char*>(kt)[e] =
                            reinterpret_cast<const unsigned char*>(&kw)[e];
                        reinterpret_cast<unsigned char*>(vt)[e] =
                            reinterpret_cast<const unsigned char*>(&vw)[e];
                    }
                    for (int e = 0; e < 4; ++e) {
                        kk[g][i + e] = static_cast<float>(kt[e]);
                        vv[g][i + e] = static_cast<float>(vt[e]);
                    }
                }
            } else {
                for (int i = 0; i < PER; ++i) {
                    kk[g][i] = static_cast<float>(kp[i]);
                    vv[g][i] = static_cast<float>(vp[i]);
                }
            }
        }
        for (int r = 0; r < R; ++r) {
            float s[G];
            for (int g = 0; g < G; ++g) {
                float t = 0.f;
                for (int i = 0; i < PER; ++i) t += qv[r][i] * kk[g][i];
                s[g] = t;
            }
            for (int off = 16; off > 0; off >>= 1)
                for (int g = 0; g < G; ++g) s[g] += __shfl_xor_sync(0xffffffffu, s[g], off);
            float mn = m[r];
            for (int g = 0; g < G; ++g) if (in[g]) mn = fmaxf(mn, s[g]);
            const float corr = __expf(m[r] - mn);
            float p[G], psum = 0.f;
            for (int g = 0; g < G; ++g) { p[g] = in[g] ? __expf(s[g] - mn) : 0.f; psum += p[g]; }
            l[r] = l[r] * corr + psum;
            for (int i = 0; i < PER; ++i) {
                float a = acc[r][i] * corr;
                for (int g = 0; g < G; ++g) a += p[g] * vv[g][i];
                acc[r][i] = a;
            }
            m[r] = mn;
        }
    }
    __shared__ float sm_m[WARPS * R];
    __shared__ float sm_l[WARPS * R];
    __shared__ float sm_acc[WARPS * R * D];
    for (int r = 0; r < R; ++r) {
        if (lane == 0) { sm_m[warp * R + r] = m[r]; sm_l[warp * R + r] = l[r]; }
        for (int i = 0; i < PER; ++i) sm_acc[(warp * R + r) * D + lane * PER + i] = acc[r][i];
    }
    __syncthreads();
    for (int e = tid; e < R * D; e += WARPS * 32) {
        const int r = e / D, d = e % D;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm_m[w * R + r]);
        float L = 0.f, A = 0.f;
        for (int w = 0; w < WARPS; ++w) {
            const float mw = sm_m[w * R + r];
            const float c = mw == -INFINITY ? 0.f : __expf(mw - M);
            L += sm_l[w * R + r] * c;
            A += sm_acc[(w * R + r) * D + d] * c;
        }
        const size_t row = ((size_t)(b * HQ + hkv * R + r) * W + wi) * S + split;
        acc_out[row * D + d] = A;
        if (d == 0) { m_out[row] = M; l_out[row] = L; }
    }
"""

# The settings, from `bench/paged_kernel.py --sweep` on an H100 (Qwen3-8B's heads, bf16,
# each timed inside a 36-layer graph and its output checked against the reference): 8 warps
# taking 4 keys at a time, the splits combined in one launch, took 126 us a layer at 32 rows
# x 640 keys against 180 for 4 warps, a key at a time and plain ops (107 against 158 for one
# row of 4,096 keys; 435 against 441 for 32 rows of 4,096); 8-byte loads were not faster.
CHUNK = 256  # keys per split
WARPS = 8
GROUP = 4  # keys a warp takes at a time (its loads in flight together), where registers allow
GROUP_MAX_REGS = 512  # ... query heads x head dims a warp holds: past it, a key at a time
VEC = False  # keys and values read 8 bytes a load (16-bit dtypes)
FUSED = True  # the splits combined by one kernel (True) or by plain ops (about 8 launches)

# The splits' partials combined in one launch, a thread per output element: the same
# arithmetic as ``flash.combine`` (each split's weighted values and sum rescaled to the
# largest max; an empty split, max -inf, weighs nothing).
_COMBINE = """
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    const int S = params[0];
    if (e >= params[1]) return;
    const size_t row = e / D;
    const int d = e % D;
    float M = -INFINITY;
    for (int s = 0; s < S; ++s) M = fmaxf(M, m[row * S + s]);
    float L = 0.f, A = 0.f;
    for (int s = 0; s < S; ++s) {
        const float ms = m[row * S + s];
        const float c = ms == -INFINITY ? 0.f : __expf(ms - M);
        L += total[row * S + s] * c;
        A += acc[(row * S + s) * D + d] * c;
    }
    out[e] = static_cast<T>(A / L);
"""


def launch_shape(rep: int, dim: int) -> tuple[int, int]:
    """The split-key kernel's warps a block and keys a warp step for ``rep`` query heads
    of ``dim`` dims a KV head (also what ``bench/splitk_emulate.py`` runs as shipped)."""
    warps = max(1, min(WARPS, SHARED_FLOATS // (rep * dim)))
    group = GROUP if rep * dim <= GROUP_MAX_REGS else 1  # (larger: local memory, not registers)
    return warps, group


def _splitk_attention(q: mx.array, store: LayerStore, view: Window, window: int | None,
                      scale: float) -> mx.array:
    keys, values = store.keys, store.values
    assert keys is not None and values is not None
    rows, heads, width, dim = q.shape
    hkv = keys.shape[1]
    rep = heads // hkv
    warps, group = launch_shape(rep, dim)
    splits = max(1, -(-(int(view.starts.max()) + width) // CHUNK))
    key = (keys.dtype, dim, rep, store.pool.block_size, warps, group, VEC)
    kernel: Any = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = mx.fast.cuda_kernel(
            name="mlxbun_paged_attention",
            input_names=["q", "k", "v", "blocks", "starts", "params", "scale"],
            output_names=["acc_out", "m_out", "l_out"], source=_SOURCE)
    consts = flash.consts_of(view, (width, view.blocks.shape[1], window or 0, hkv, splits,
                                    CHUNK), scale)
    part = (rows, heads, width, splits)
    acc, m, total = kernel(
        inputs=[q.astype(keys.dtype), keys, values, view.blocks, view.offset, *consts],
        template=[("T", keys.dtype), ("D", dim), ("R", rep),
                  ("BS", store.pool.block_size), ("WARPS", warps), ("G", group),
                  ("VEC", VEC)],
        grid=(rows * hkv * width * splits * warps * 32, 1, 1), threadgroup=(warps * 32, 1, 1),
        output_shapes=[(*part, dim), part, part],
        output_dtypes=[mx.float32, mx.float32, mx.float32])
    if FUSED:
        return _combined(acc, m, total, q.dtype, view)
    return flash.combine(acc, m, total).astype(q.dtype)


def _combined(acc: mx.array, m: mx.array, total: mx.array, dtype: mx.Dtype,
              view: Window) -> mx.array:
    """:func:`flash.combine` in one kernel launch (``FUSED``)."""
    rows, heads, width, splits, dim = acc.shape
    key = ("combine", dtype, dim)
    kernel: Any = _kernels.get(key)
    if kernel is None:
        kernel = _kernels[key] = mx.fast.cuda_kernel(
            name="mlxbun_paged_combine", input_names=["acc", "m", "total", "params"],
            output_names=["out"], source=_COMBINE)
    n = rows * heads * width * dim
    params = flash.consts_of(view, (splits, n), 0.0)[0]
    (out,) = kernel(inputs=[acc, m, total, params], template=[("T", dtype), ("D", dim)],
                    grid=(-(-n // 256) * 256, 1, 1), threadgroup=(256, 1, 1),
                    output_shapes=[(rows, heads, width, dim)], output_dtypes=[dtype])
    return cast(mx.array, out)


