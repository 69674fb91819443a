"""Benchmark kernels in the spirit of the paper's Table IV (SHOC and Rodinia 1D kernels),
written for devchar. They are `suite="benchmark"` rows: never for training, measured at
several input sizes so a model's prediction can be plotted against measurement over size.

Each has a data builder: `build(size, rng) -> (gsize, values)` where values maps every
kernel parameter to a numpy array (buffers; structure arrays such as CSR row pointers hold
valid data), a number (scalars), or None (__local arrays: lsize elements). `size` is the
benchmark's own knob (elements, rows, nodes, points, atoms): the `input_size` column.
Kernels that would change their own inputs between repetitions (BFS clearing its frontier)
are written so every repetition does the same work.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

LSIZE = 64  # the benchmarks' work-group size; spmv_csr_vector uses one work-group per row
_VECTOR_LSIZE = 32


@dataclass(frozen=True)
class Benchmark:
    name: str
    source: str
    build: Callable[[int, np.random.Generator], tuple[int, dict]]
    lsize: int = LSIZE

    @property
    def kernel_id(self) -> str:
        return f"bench_{self.name}"


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def _f32(rng, n) -> np.ndarray:
    return rng.random(n, dtype=np.float32)


def _csr(rng, rows: int, avg: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A random square CSR matrix: (row pointers, column indices, values), ~avg non-zeros a row."""
    lens = rng.poisson(avg, rows).clip(1, 4 * avg)
    rowptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    cols = rng.integers(0, rows, rowptr[-1], dtype=np.int32)
    return rowptr, cols, _f32(rng, int(rowptr[-1]))


TRIAD = """__kernel void triad(__global const float* a, __global const float* b, __global float* c, float s, int n) {
    int i = get_global_id(0);
    if (i < n) { c[i] = a[i] + s * b[i]; }
}
"""

REDUCE = """__kernel void reduce(__global const float* in, __global float* out, __local float* sdata, int n) {
    int tid = get_local_id(0);
    float s = 0.0f;
    for (int i = get_global_id(0); i < n; i += get_global_size(0)) { s += in[i]; }
    sdata[tid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = get_local_size(0) / 2; k > 0; k >>= 1) {
        if (tid < k) { sdata[tid] += sdata[tid + k]; }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (tid == 0) { out[get_group_id(0)] = sdata[0]; }
}
"""

SCAN = """__kernel void bottom_scan(__global const float* in, __global float* out, __global const float* isums,
                          __local float* tmp, int n) {
    int lid = get_local_id(0);
    int i = get_global_id(0);
    tmp[lid] = i < n ? in[i] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int off = 1; off < get_local_size(0); off <<= 1) {
        float v = lid >= off ? tmp[lid - off] : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        tmp[lid] += v;
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (i < n) { out[i] = tmp[lid] + isums[get_group_id(0)]; }
}
"""

SPMV_SCALAR = """__kernel void spmv_csr_scalar(__global const float* val, __global const float* vec,
                              __global const int* cols, __global const int* rowptr, __global float* out, int dim) {
    int row = get_global_id(0);
    if (row < dim) {
        float t = 0.0f;
        for (int j = rowptr[row]; j < rowptr[row + 1]; j++) { t += val[j] * vec[cols[j]]; }
        out[row] = t;
    }
}
"""

SPMV_VECTOR = """__kernel void spmv_csr_vector(__global const float* val, __global const float* vec,
                              __global const int* cols, __global const int* rowptr, __global float* out,
                              __local float* partial, int dim) {
    int lid = get_local_id(0);
    int row = get_group_id(0);
    float t = 0.0f;
    if (row < dim) {
        for (int j = rowptr[row] + lid; j < rowptr[row + 1]; j += get_local_size(0)) { t += val[j] * vec[cols[j]]; }
    }
    partial[lid] = t;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int k = get_local_size(0) / 2; k > 0; k >>= 1) {
        if (lid < k) { partial[lid] += partial[lid + k]; }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0 && row < dim) { out[row] = partial[0]; }
}
"""

SPMV_ELL = """__kernel void spmv_ellpackr(__global const float* val, __global const float* vec,
                            __global const int* cols, __global const int* rowlen, __global float* out, int dim) {
    int t = get_global_id(0);
    if (t < dim) {
        float r = 0.0f;
        for (int i = 0; i < rowlen[t]; i++) { int ind = i * dim + t; r += val[ind] * vec[cols[ind]]; }
        out[t] = r;
    }
}
"""

BFS = """__kernel void bfs_step(__global const int* starting, __global const int* no_of_edges,
                       __global const int* edges,
                       __global const char* mask, __global char* updating, __global const char* visited,
                       __global int* cost, int no_of_nodes) {
    int tid = get_global_id(0);
    if (tid < no_of_nodes && mask[tid]) {
        for (int i = starting[tid]; i < no_of_edges[tid] + starting[tid]; i++) {
            int id = edges[i];
            if (!visited[id]) { cost[id] = cost[tid] + 1; updating[id] = 1; }
        }
    }
}
"""

KMEANS = """__kernel void kmeans_assign(__global const float* feature, __global const float* clusters,
                            __global int* membership, int npoints, int nclusters, int nfeatures) {
    int p = get_global_id(0);
    if (p < npoints) {
        int index = 0;
        float min_dist = FLT_MAX;
        for (int i = 0; i < nclusters; i++) {
            float dist = 0.0f;
            for (int l = 0; l < nfeatures; l++) {
                float d = feature[l * npoints + p] - clusters[i * nfeatures + l];
                dist += d * d;
            }
            if (dist < min_dist) { min_dist = dist; index = i; }
        }
        membership[p] = index;
    }
}
"""

NN = """__kernel void nearest_neighbor(__global const float2* loc, __global float* dist, int n, float lat, float lng) {
    int i = get_global_id(0);
    if (i < n) {
        float2 l = loc[i];
        dist[i] = sqrt((lat - l.x) * (lat - l.x) + (lng - l.y) * (lng - l.y));
    }
}
"""

LJ = """__kernel void compute_lj_force(__global float4* force, __global const float4* position, int neigh_count,
                               __global const int* neigh_list, float cutsq, float lj1, float lj2, int inum) {
    int idx = get_global_id(0);
    if (idx < inum) {
        float4 ipos = position[idx];
        float4 f = (float4)(0.0f);
        for (int j = 0; j < neigh_count; j++) {
            float4 jpos = position[neigh_list[j * inum + idx]];
            float delx = ipos.x - jpos.x, dely = ipos.y - jpos.y, delz = ipos.z - jpos.z;
            float r2inv = delx * delx + dely * dely + delz * delz;
            if (r2inv < cutsq) {
                r2inv = 1.0f / r2inv;
                float r6inv = r2inv * r2inv * r2inv;
                float force_c = r2inv * r6inv * (lj1 * r6inv - lj2);
                f.x += delx * force_c; f.y += dely * force_c; f.z += delz * force_c;
            }
        }
        force[idx] = f;
    }
}
"""


def _triad(n, rng):
    return _round_up(n, LSIZE), dict(a=_f32(rng, n), b=_f32(rng, n), c=np.zeros(n, np.float32), s=1.75, n=n)


def _reduce(n, rng):  # SHOC: a fixed grid strides over the input, only the data size changes
    groups = 64
    return groups * LSIZE, {"in": _f32(rng, n), "out": np.zeros(groups, np.float32), "sdata": None, "n": n}


def _scan(n, rng):
    g = _round_up(n, LSIZE)
    return g, {"in": _f32(rng, n), "out": np.zeros(n, np.float32), "isums": _f32(rng, g // LSIZE), "tmp": None, "n": n}


def _spmv(n, rng, vector=False):
    rowptr, cols, val = _csr(rng, n, 16)
    values = dict(val=val, vec=_f32(rng, n), cols=cols, rowptr=rowptr, out=np.zeros(n, np.float32), dim=n)
    if vector:
        return n * _VECTOR_LSIZE, {**values, "partial": None}
    return _round_up(n, LSIZE), values


def _ellpack(n, rng):
    rowptr, cols, val = _csr(rng, n, 16)
    lens = np.diff(rowptr)
    width = int(lens.max())
    ell_cols, ell_val = np.zeros((width, n), np.int32), np.zeros((width, n), np.float32)  # column-major
    rows = np.repeat(np.arange(n), lens)
    slots = np.arange(rowptr[-1]) - rowptr[rows]
    ell_cols[slots, rows], ell_val[slots, rows] = cols, val
    return _round_up(n, LSIZE), dict(val=ell_val.ravel(), vec=_f32(rng, n), cols=ell_cols.ravel(),
                                     rowlen=lens.astype(np.int32), out=np.zeros(n, np.float32), dim=n)


def _bfs(n, rng):
    degree = rng.integers(1, 12, n).astype(np.int32)
    starting = np.concatenate([[0], np.cumsum(degree)[:-1]]).astype(np.int32)
    edges = rng.integers(0, n, int(degree.sum()), dtype=np.int32)
    mask = (rng.random(n) < 0.2).astype(np.int8)  # a frontier of about a fifth of the nodes
    visited = (rng.random(n) < 0.3).astype(np.int8) | mask
    return _round_up(n, LSIZE), dict(starting=starting, no_of_edges=degree, edges=edges, mask=mask,
                                     updating=np.zeros(n, np.int8), visited=visited,
                                     cost=np.zeros(n, np.int32), no_of_nodes=n)


def _kmeans(n, rng, clusters=5, features=34):  # Rodinia's kdd_cup input has 34 features
    return _round_up(n, LSIZE), dict(feature=_f32(rng, n * features), clusters=_f32(rng, clusters * features),
                                     membership=np.zeros(n, np.int32), npoints=n, nclusters=clusters,
                                     nfeatures=features)


def _nn(n, rng):
    loc = (rng.random((n, 2)) * [180, 360] - [90, 180]).astype(np.float32).ravel()
    return _round_up(n, LSIZE), dict(loc=loc, dist=np.zeros(n, np.float32), n=n, lat=30.0, lng=90.0)


def _lj(n, rng, neigh=32):
    pos = np.zeros((n, 4), np.float32)
    pos[:, :3] = rng.random((n, 3)) * np.cbrt(n)  # unit density: a few neighbours inside the cut-off
    offsets = rng.integers(1, n, (neigh, n)) if n > 1 else np.zeros((neigh, n), int)
    neigh_list = ((np.arange(n) + offsets) % n).astype(np.int32).ravel()  # never the atom itself
    return _round_up(n, LSIZE), dict(force=np.zeros(n * 4, np.float32), position=pos.ravel(), neigh_count=neigh,
                                     neigh_list=neigh_list, cutsq=16.0, lj1=1.5, lj2=2.0, inum=n)


BENCHMARKS = {b.name: b for b in (
    Benchmark("triad", TRIAD, _triad),
    Benchmark("reduce", REDUCE, _reduce),
    Benchmark("bottom_scan", SCAN, _scan),
    Benchmark("spmv_csr_scalar", SPMV_SCALAR, _spmv),
    Benchmark("spmv_csr_vector", SPMV_VECTOR, lambda n, rng: _spmv(n, rng, vector=True), lsize=_VECTOR_LSIZE),
    Benchmark("spmv_ellpackr", SPMV_ELL, _ellpack),
    Benchmark("bfs_step", BFS, _bfs),
    Benchmark("kmeans_assign", KMEANS, _kmeans),
    Benchmark("nearest_neighbor", NN, _nn),
    Benchmark("compute_lj_force", LJ, _lj),
)}
