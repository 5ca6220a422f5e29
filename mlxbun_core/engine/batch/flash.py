"""Flash decoding over block tables: the paged kernel's next form, not yet the default.

``attention.py``'s kernel walks a row's keys one per warp with a shuffle reduction per
query head, and was 3.6x slower than MLX's dense decode attention at 32 rows x 640 keys
on an H100 (``bench/NOTES.md``). This one stages tiles of keys and values in shared
memory and corrects its running softmax once per tile. It is exact against the plain-ops
reference when its CUDA source runs on the CPU (``bench/kernel_emulate.py``, under
AddressSanitizer) and compiles with ``nvcc`` (``bench/kernel_source.py``), but on an H100
it faulted (compute-sanitizer: a 4-byte shared-memory write past the block's static
allocation, 2026-12-07), so ``attention.KERNEL`` keeps the split-key kernel until a
device sitting finds why. ``attention.KERNEL = "flash"`` selects it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import mlx.core as mx

if TYPE_CHECKING:
    import numpy as np

    from .storage import LayerStore


class Window(Protocol):
    """What the kernel reads of a pass's tables (``view.Window``)."""

    blocks: mx.array  # (rows, n) block tables
    offset: mx.array  # (rows,) each row's first query position
    starts: np.ndarray  # the same on the host
    kernel_consts: dict[Any, list[mx.array]]  # the kernel's constant inputs, per pass

_kernels: dict[tuple[Any, ...], Any] = {}  # the compiled kernels, by dtype and mode


# What both kernels' thread blocks start from: which (row, KV head, query position, split
# of the keys) a block serves (the launch puts the splits innermost) and the positions
# [lo, hi] it reads: the split's, within the row's causal and sliding-window limits.
BLOCK_SPAN = """
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int W = params[0], NB = params[1], window = params[2], HKV = params[3];
    const int S = params[4], CHUNK = params[5];
    int blk = blockIdx.x;
    const int split = blk % S; blk /= S;
    const int wi = blk % W; blk /= W;
    const int hkv = blk % HKV; const int b = blk / HKV;
    const int HQ = HKV * R;
    const int pos = starts[b] + wi;
    int lo = window > 0 ? max(0, pos - window + 1) : 0;
    lo = max(lo, split * CHUNK);
    const int hi = min(min(pos, NB * BS - 1), split * CHUNK + CHUNK - 1);
"""

# Flash decoding over block tables. One thread block per (row, KV head, query position,
# split of the keys); its NT threads walk the split a tile of TILE keys at a time:
# Every loop over a tile runs to the compile-time TILE with the tile's length n checked
# inside (an H100 build read and wrote shared memory one tile past its end in loops bounded
# by n, twice, at places the source and a CPU run under AddressSanitizer never reach):
#   1. the tile's slots are looked up in the row's block table, and its keys and values
#      copied into shared memory in 16-byte vectors (rows padded so reads do not collide);
#   2. scores: a thread per (key, query head) pair, the queries read from shared memory;
#   3. a warp per query head: the tile's max and sum, the running softmax corrected once
#      per tile (not once per key), then the tile's values weighted into its lanes' dims.
# A split's (max, sum, weighted values) are combined by plain ops; with one split the
# kernel normalises and writes the output itself (SINGLE). Splitting the keys keeps the
# device busy when there are few rows (a lone long stream) as well as many.
_SOURCE = """
    static_assert(TILE <= NT, "a thread per key of a tile");
    constexpr int NW = NT / 32;
    constexpr int VEC = 16 / sizeof(T);      // T elements per 16-byte vector
    constexpr int VPR = D / VEC;             // vectors per key row
    constexpr int DP = D + VEC;              // padded shared row (T elements)
    constexpr int PER = D / 32;              // dims per lane in the weighted sum
    constexpr int RW = (R + NW - 1) / NW;    // query heads per warp
""" + BLOCK_SPAN + """
    __shared__ __align__(16) T ks[TILE * DP];
    __shared__ __align__(16) T vs[TILE * DP];
    __shared__ float qs[R * D];
    __shared__ float ps[R * TILE];
    __shared__ int slot_s[TILE];

    const float sc = scale[0];
    for (int e = tid; e < R * D; e += NT) {
        const int r = e / D, d = e % D;
        qs[e] = static_cast<float>(q[((size_t)(b * HQ + hkv * R + r) * W + wi) * D + d]) * sc;
    }
    float acc[RW][PER], m_run[RW], l_run[RW];
    for (int i = 0; i < RW; ++i) {
        m_run[i] = -INFINITY; l_run[i] = 0.f;
        for (int d = 0; d < PER; ++d) acc[i][d] = 0.f;
    }
    for (int t0 = lo; t0 <= hi; t0 += TILE) {
        const int n = min(TILE, hi - t0 + 1);
        __syncthreads();  // the last tile's readers are done (and qs is written)
        if (tid < TILE) {  // one thread per key of the tile (TILE <= NT): no loop to unroll
            const int p = t0 + tid;
            slot_s[tid] = tid < n ? blocks[b * NB + p / BS] * BS + p % BS : 0;
        }
        __syncthreads();
        if (VECLOAD) {
            for (int e = tid; e < TILE * VPR; e += NT) {
                const int j = e / VPR, c = e % VPR;
                if (j >= n) continue;
                const size_t base = ((size_t)slot_s[j] * HKV + hkv) * D;
                reinterpret_cast<uint4*>(ks + j * DP)[c] =
                    reinterpret_cast<const uint4*>(k + base)[c];
                reinterpret_cast<uint4*>(vs + j * DP)[c] =
                    reinterpret_cast<const uint4*>(v + base)[c];
            }
        } else {
            for (int e = tid; e < TILE * D; e += NT) {
                const int j = e / D, dd = e % D;
                if (j >= n) continue;
                const size_t base = ((size_t)slot_s[j] * HKV + hkv) * D;
                ks[j * DP + dd] = k[base + dd];
                vs[j * DP + dd] = v[base + dd];
            }
        }
        __syncthreads();
        for (int e = tid; e < R * TILE; e += NT) {
            const int j = e % TILE, r = e / TILE;
            float s = -INFINITY;
            if (j < n) {  // (T read as T: no 16-byte register reread through a T pointer)
                const T* kr = ks + j * DP;
                const float* qr = qs + r * D;
                s = 0.f;
                for (int d = 0; d < D; ++d) s += qr[d] * static_cast<float>(kr[d]);
            }
            ps[r * TILE + j] = s;
        }
        __syncthreads();
        for (int i = 0; i < RW; ++i) {
            const int r = warp + i * NW;
            if (r >= R) break;
            float* pr = ps + r * TILE;
            float top = -INFINITY;
            for (int j = lane; j < TILE; j += 32) if (j < n) top = fmaxf(top, pr[j]);
            for (int off = 16; off > 0; off >>= 1)
                top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, off));
            const float mn = fmaxf(m_run[i], top);
            const float corr = __expf(m_run[i] - mn);
            float sum = 0.f;
            for (int j = lane; j < TILE; j += 32) {
                const float p = j < n ? __expf(pr[j] - mn) : 0.f;
                pr[j] = p;
                sum += p;
            }
            for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
            l_run[i] = l_run[i] * corr + sum;
            m_run[i] = mn;
            __syncwarp();
            for (int d = 0; d < PER; ++d) acc[i][d] *= corr;
            for (int j = 0; j < TILE; ++j) {
                if (j >= n) break;  // (a stale value row past n: 0 x NaN is NaN)
                const float p = pr[j];
                const T* vr = vs + j * DP + lane * PER;
                for (int d = 0; d < PER; ++d) acc[i][d] += p * static_cast<float>(vr[d]);
            }
        }
    }
    for (int i = 0; i < RW; ++i) {
        const int r = warp + i * NW;
        if (r >= R) break;
        const size_t row = (size_t)(b * HQ + hkv * R + r) * W + wi;
        if (SINGLE) {
            const float inv = l_run[i] > 0.f ? 1.f / l_run[i] : 0.f;
            for (int d = 0; d < PER; ++d)
                acc_out[row * D + lane * PER + d] = static_cast<O>(acc[i][d] * inv);
        } else {
            const size_t at = row * S + split;
            for (int d = 0; d < PER; ++d)
                acc_out[at * D + lane * PER + d] = static_cast<O>(acc[i][d]);
            if (lane == 0) { m_out[at] = m_run[i]; l_out[at] = l_run[i]; }
        }
    }
"""

NT = 128  # threads per block
VECLOAD = True  # keys and values copied to shared memory 16 bytes at a time (False: one by one)
SHARED_BYTES = 48 * 1024  # a kernel's static shared memory
TARGET_BLOCKS = 512  # splits are added until a pass has about this many thread blocks


def tile_for(dim: int, itemsize: int, rep: int) -> int:
    """Keys a thread block stages at a time: the most (64, 32 or 16) whose key and
    value tiles, queries and scores fit the kernel's shared memory; 0 when none does."""
    for tile in (64, 32, 16):
        shared = 2 * tile * (dim + 16 // itemsize) * itemsize + rep * (dim + tile) * 4 + tile * 4
        if shared <= SHARED_BYTES:
            return tile
    return 0


def splits_for(rows: int, hkv: int, width: int, keys: int, tile: int) -> tuple[int, int]:
    """``(splits, chunk)``: how many parts each (row, KV head, position)'s ``keys``
    are cut into so a pass has about ``TARGET_BLOCKS`` thread blocks, and the keys of
    a part (a multiple of ``tile``). A lone long stream gets many; 32 rows few or one."""
    tiles = max(1, -(-keys // tile))
    want = max(1, -(-TARGET_BLOCKS // max(1, rows * hkv * width)))
    per = -(-tiles // min(tiles, want))
    chunk = per * tile
    return -(-keys // chunk), chunk


def _kernel(dtype: mx.Dtype, single: bool) -> Any:
    kernel = _kernels.get((dtype, single))
    if kernel is None:
        kernel = _kernels[(dtype, single)] = mx.fast.cuda_kernel(
            name="mlxbun_paged_attention" + ("_single" if single else ""),
            input_names=["q", "k", "v", "blocks", "starts", "params", "scale"],
            output_names=["acc_out", "m_out", "l_out"], source=_SOURCE)
    return kernel


def flash_attention(q: mx.array, store: LayerStore, view: Window, window: int | None,
                      scale: float) -> mx.array:
    outs = flash_partials(q, store, view, window, scale)
    if len(outs) == 1:
        return outs[0]
    return combine(*outs).astype(q.dtype)


def flash_partials(q: mx.array, store: LayerStore, view: Window, window: int | None,
                   scale: float) -> list[mx.array]:
    """The kernel's own outputs: ``[attention]`` when one split serves every key, else
    each split's ``[acc, m, total]`` for :func:`combine` (the device check reads them to
    tell a kernel's NaN from one made after it)."""
    keys, values = store.keys, store.values
    assert keys is not None and values is not None
    rows, heads, width, dim = q.shape
    hkv = keys.shape[1]
    rep = heads // hkv
    tile = tile_for(dim, keys.dtype.size, rep)
    splits, chunk = splits_for(rows, hkv, width, int(view.starts.max()) + width, tile)
    single = splits == 1
    consts = consts_of(view, (width, view.blocks.shape[1], window or 0, hkv, splits, chunk),
                     scale)
    part = (rows, heads, width, splits)
    outs = _kernel(keys.dtype, single)(
        inputs=[q.astype(keys.dtype), keys, values, view.blocks, view.offset, *consts],
        template=[("T", keys.dtype), ("O", keys.dtype if single else mx.float32), ("D", dim),
                  ("R", rep), ("BS", store.pool.block_size), ("TILE", tile), ("NT", NT),
                  ("SINGLE", single), ("VECLOAD", VECLOAD)],
        grid=(rows * hkv * width * splits * NT, 1, 1), threadgroup=(NT, 1, 1),
        output_shapes=[(rows, heads, width, dim), (1,), (1,)] if single
        else [(*part, dim), part, part],
        output_dtypes=[keys.dtype, mx.float32, mx.float32] if single
        else [mx.float32, mx.float32, mx.float32])
    return [cast(mx.array, outs[0])] if single else list(outs)


def consts_of(view: Window, params: tuple[int, ...], scale: float) -> list[mx.array]:
    """The kernel's parameter and scale arrays, made once per pass and reused by every
    layer that asks for the same ones (not a host-to-device copy per layer)."""
    memo = view.kernel_consts
    got = memo.get((params, scale))
    if got is None:
        got = memo[(params, scale)] = [mx.array(params, dtype=mx.int32),
                                       mx.array([scale], dtype=mx.float32)]
    return got


def combine(acc: mx.array, m: mx.array, total: mx.array) -> mx.array:
    """Attention from per-split partials: ``acc`` (``(..., splits, dim)``, the split's
    softmax-weighted values before normalising), ``m`` and ``total`` (``(..., splits)``,
    its max score and sum of exponentials; an empty split has ``m = -inf``)."""
    top = mx.max(m, axis=-1, keepdims=True)
    w = mx.where(m == -mx.inf, 0.0, mx.exp(m - top))
    return (acc * w[..., None]).sum(axis=-2) / (total * w).sum(axis=-1)[..., None]
