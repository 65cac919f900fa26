"""A generated f32 GEMM: ``C[M, N] = A[M, K] @ B[K, N] (+ bias[N]), then an activation``.

The structure is the one of BLIS and of ONNX Runtime's MLAS (Goto's algorithm): ``B`` is
packed once into column panels of ``NR`` columns (``[ceil(N / NR), K, NR]``, the last panel
zero-padded), which is what an inference weight becomes at its first call; ``A`` is packed per
call into row panels of ``MR`` rows for a block of ``KC`` columns; the micro-kernel keeps an
``MR x NR`` tile of ``C`` in registers (MR * NR / lanes accumulators: 12 ymm on AVX2 with
MR = 6, NR = 16; 24 zmm on AVX-512 with MR = 12, NR = 32) and, for each k, loads one row of
the B panel, broadcasts each of the MR values of A and does MR * NR / lanes fused
multiply-adds. The loops around it:

    for pc in range(0, K, KC):               # a KC-slice of B's panels stays in L2
        for ic in range(0, M, MC):           # pack A[ic:ic+MC, pc:pc+KC] (L2)
            for p in panels[plo:phi]:        # one B micro-panel, KC x NR (L1)
                for ir in range(0, mc, MR):  # the micro-kernel
                    C[tile] (+)= A_panel @ B_panel

The first KC-slice stores its tile, the later ones add to it, and the last one adds the bias
(in registers, before the store, for a whole tile: 1 to 5% on the [M, 256] x [256, N] shapes of
the small transformers, where there is one slice; in the epilogue for an edge tile) and applies
the activation to the tile while it is in L1 (a short loop the vectorizer turns
into vector code, the math functions inlined from ``mathlib``). Threads split the panels
(``plo``, ``phi``): each packs its own copy of A into its own workspace.

One kernel serves every shape: M, N, K and the strides are arguments. The function is

    void NAME(ptr A, i64 lda, i64 sak, ptr Bp, ptr bias, ptr C, i64 ldc, i64 M, i64 N, i64 K,
              ptr workspace, i64 plo, i64 phi, i64 mcx)

where ``A[i, k]`` is at ``A + i * lda + k * sak`` (so a transposed view needs no copy),
``bias`` is null for none, ``mcx`` is the most rows of A in one block (M is split evenly into
blocks of at most ``mcx`` rows, each a multiple of MR), and ``workspace`` holds at least
``mcx * KC`` floats, or is null:
then A (whose k stride must be 1) is not packed but read where it is, row ``r`` of a tile at
``A + r * lda`` (rows past M read the last row again; their results are never stored), as
MLAS does; see ``read_a_in_place`` for when.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..ops._lazy import torch
from .jit import jit
from .cpu import LAUNCHERS, kernel_pool, l2_bytes, launcher, launcher_ir
from .lowering import vector_width
from .mathlib import declarations, f32

__all__ = ["GemmConfig", "gemm_config", "gemm_configs", "choose", "gemm_ir", "ACTIVATIONS", "config", "kernel", "pack_b", "gemm", "PreparedGemm", "read_a_in_place", "PARALLEL_MIN_MACS"]


@dataclass(frozen=True)
class GemmConfig:
    lanes: int       # f32 per vector register
    mr: int          # rows of the register tile
    nr: int          # columns of the register tile (a multiple of lanes)
    kc: int          # depth of one packed block
    mc: int          # rows of A packed at once (a multiple of mr)
    unroll: int = 4  # k steps per trip of the micro-kernel's loop
    prefetch: bool = True  # prefetch the next B panel while this one is used

    @property
    def workspace(self) -> int:
        return self.mc * self.kc


def gemm_configs(lanes: int) -> tuple[GemmConfig, ...]:
    """The register tiles for ``lanes`` f32 lanes, each with 12 (AVX2) or 24 (AVX-512)
    accumulators: 6 x 16 and 4 x 24 for AVX2 (with 2 or 3 B rows and a broadcast, 15 or 16 of
    the 16 ymm registers), 6 x 64, 12 x 32 and 8 x 48 for AVX-512 (24 accumulators, 4, 2 or 3
    B rows and a broadcast). Which one a node uses is the one that computes the fewest padded
    rows and columns (``choose``), ties going to the first: 4 x 24 for the 32 rows of a
    batch-32 MLP on AVX2 (6 x 16 would compute 36), 6 x 16 where M is a multiple of 6. On
    AVX-512, 6 x 64 loads the fewest values per multiply-add (10 loads for 24 FMAs against 14
    for 12 x 32) and was 2 to 10% faster than 12 x 32 on the transformer shapes
    ([512, 256] x [256, 1024], [148, 256] x [256, 1024], [512, 256] x [256, 256]; AMD EPYC
    Zen 4, interleaved)."""
    if lanes >= 16:
        return (GemmConfig(lanes=16, mr=6, nr=64, kc=256, mc=96), GemmConfig(lanes=16, mr=12, nr=32, kc=256, mc=96),
                GemmConfig(lanes=16, mr=8, nr=48, kc=256, mc=96))
    return (GemmConfig(lanes=8, mr=6, nr=16, kc=256, mc=72), GemmConfig(lanes=8, mr=4, nr=24, kc=256, mc=72))


def gemm_config(lanes: int) -> GemmConfig:
    """The first (default) tile for ``lanes``."""
    return gemm_configs(lanes)[0]


# A tile later in gemm_configs' order is taken only when the earlier ones compute this much
# more padded work: on AVX-512, 6 x 64 was 1 to 6% faster than 8 x 48 at equal work
# ([512, 256] x [256, 8192], [148, 256] x [256, 768], [512, 1024] x [1024, 256]; Zen 4).
PAD_SLACK = 1.02


def choose(m: int, n: int, lanes: int, configs: tuple[GemmConfig, ...] | None = None) -> GemmConfig:
    """The first tile (in ``gemm_configs`` order, or of ``configs``) whose padded work for an
    [m, n] result is within ``PAD_SLACK`` of the least."""
    def padded(c: GemmConfig) -> int:
        return -(-m // c.mr) * c.mr * (-(-n // c.nr) * c.nr)
    cfgs = configs or gemm_configs(lanes)
    least = min(padded(c) for c in cfgs)
    return next(c for c in cfgs if padded(c) <= PAD_SLACK * least)


# activation -> (scalar IR lines on %v giving %r, math functions used)
def _act_lines(act: str) -> tuple[list[str], set[str]]:
    if act == "none":
        return ["  %r = fadd float %v, 0.0"], set()
    if act == "relu":
        return ["  %c = fcmp ogt float %v, 0.0", "  %r = select i1 %c, float %v, float 0.0"], set()
    if act == "gelu":
        # x * Phi(x) with Phi from erfc alone: Phi(x) = erfc(|x| / sqrt 2) / 2 below 0 and
        # 1 - erfc(|x| / sqrt 2) / 2 above, erfc(a) = t exp(-a^2 + P(t)), t = 1 / (1 + a / 2)
        # (the Chebyshev fit of Numerical Recipes, fractional error under 1.2e-7 for every a,
        # so GELU's small negative tail keeps its relative accuracy). One division and one exp,
        # where erf's two branches cost two of each (0.23 against 0.06 ms over a [148, 1024]
        # tile set, AMD EPYC Zen 4).
        p_lines = []
        acc = f32(0.17087277)
        for i, c in enumerate([-0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
                               0.09678418, 0.37409196, 1.00002368, -1.26551223]):
            p_lines += [f"  %pa{i} = call float @llvm.fma.f32(float {acc}, float %t, float {f32(c)})"]
            acc = f"%pa{i}"
        return ([f"  %av = call float @llvm.fabs.f32(float %v)",
                 f"  %a = fmul float %av, {f32(0.7071067811865476)}",
                 "  %ah = fmul float %a, 0.5",
                 "  %ah1 = fadd float %ah, 1.0",
                 "  %t = fdiv float 1.0, %ah1"] + p_lines +
                ["  %aa = fmul float %a, %a",
                 "  %naa = fneg float %aa",
                 f"  %ex = fadd float %naa, {acc}",
                 "  %e = call float @pt_expf_neg(float %ex)",
                 "  %erfc = fmul float %t, %e",
                 "  %lo = fmul float %erfc, 0.5",
                 "  %hi = fsub float 1.0, %lo",
                 "  %neg = fcmp olt float %v, 0.0",
                 "  %phi = select i1 %neg, float %lo, float %hi",
                 "  %r = fmul float %v, %phi"], {"exp"})
    if act == "gelu_tanh":
        # x (1 + tanh(u)) / 2 = x / (1 + exp(-2u)), u = sqrt(2 / pi) (x + 0.044715 x^3): one
        # exp and one division, accurate in the negative tail where 1 + tanh(u) cancels.
        return ["  %x2 = fmul float %v, %v",
                "  %x3 = fmul float %x2, %v",
                f"  %i0 = fmul float %x3, {f32(0.044715)}",
                "  %i1 = fadd float %v, %i0",
                f"  %i2 = fmul float %i1, {f32(-2 * 0.7978845608028654)}",
                "  %e = call float @pt_expf(float %i2)",
                "  %d = fadd float %e, 1.0",
                "  %r = fdiv float %v, %d"], {"exp"}
    if act == "silu":
        return ["  %n = fneg float %v",
                "  %e = call float @pt_expf(float %n)",
                "  %d = fadd float %e, 1.0",
                "  %r = fdiv float %v, %d"], {"exp"}
    if act == "sigmoid":
        return ["  %n = fneg float %v",
                "  %e = call float @pt_expf(float %n)",
                "  %d = fadd float %e, 1.0",
                "  %r = fdiv float 1.0, %d"], {"exp"}
    if act == "tanh":
        return ["  %r = call float @pt_tanhf(float %v)"], {"tanh"}
    if act in ("relu6", "hardswish"):
        # min(max(x, 0), 6) (ReLU6); hardswish x * min(max(x + 3, 0), 6) / 6, in torch's order
        # of operations (epilogue.py's CLAMPS), a NaN kept as torch keeps it
        src = "%v" if act == "relu6" else "%a3"
        lines = [] if act == "relu6" else ["  %a3 = fadd float %v, 3.0"]
        lines += [f"  %lo = fcmp olt float {src}, 0.0", f"  %m0 = select i1 %lo, float 0.0, float {src}",
                  "  %hi = fcmp ogt float %m0, 6.0", "  %m6 = select i1 %hi, float 6.0, float %m0"]
        if act == "relu6":
            return lines + ["  %r = fadd float %m6, 0.0"], set()
        return lines + ["  %p = fmul float %v, %m6", "  %r = fdiv float %p, 6.0"], set()
    raise ValueError(f"gemm: no activation {act!r}; one of {sorted(ACTIVATIONS)}")


ACTIVATIONS = frozenset({"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "relu6", "hardswish"})


def gemm_ir(name: str, cfg: GemmConfig, act: str = "none") -> str:
    """The LLVM IR of one GEMM kernel (see the module doc)."""
    act_fn = _act_fn_ir(name, act)
    return "\n\n".join([_gemm_declarations(cfg.lanes), declarations(set()), act_fn,
                        "\n".join(_micro_ir(name, cfg, act, False)), "\n".join(_micro_ir(name, cfg, act, True)),
                        "\n".join(_pack_ir(name, cfg)), "\n".join(_driver_ir(name, cfg))]) + "\n"


def _act_fn_ir(name: str, act: str) -> str:
    """The scalar activation ``@NAME_act(float %v)`` that the micro-kernel's epilogue calls."""
    act_lines, _used = _act_lines(act)
    return "\n".join([f"define internal float @{name}_act(float %v) alwaysinline nounwind {{"] + act_lines +
                     ["  ret float %r", "}"])


def _gemm_declarations(L: int) -> str:
    """The declarations of the vector intrinsics the GEMM kernel calls."""
    vt = f"<{L} x float>"
    return "\n".join([f"declare {vt} @llvm.fma.v{L}f32({vt}, {vt}, {vt})",
                      "declare void @llvm.prefetch.p0(ptr, i32, i32, i32)",
                      f"declare {vt} @llvm.masked.load.v{L}f32.p0(ptr, i32, <{L} x i1>, {vt})",
                      f"declare void @llvm.masked.store.v{L}f32.p0({vt}, ptr, i32, <{L} x i1>)"])


# --- the micro-kernel: acc[r][v] over kc steps, then the tile written back -------------------

def _fma_step(cfg: GemmConfig, tag: str, ap: str, bp: str, accs: list[list[str]], k_off: int,
              direct: bool = False) -> tuple[list[str], list[list[str]]]:
    """One k step of the micro-kernel: a row of the B panel, MR broadcasts of A, MR x NV FMAs."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    lines = []
    bs = []
    for v in range(NV):
        p = f"%{tag}bp{v}"
        lines.append(f"  {p} = getelementptr inbounds float, ptr {bp}, i64 {k_off * NR + v * L}")
        lines.append(f"  %{tag}b{v} = load {vt}, ptr {p}, align 4")
        bs.append(f"%{tag}b{v}")
    new = []
    for r in range(MR):
        p = f"%{tag}ap{r}"
        if direct:  # row r of A at ap + roff_r, its k-th value k further on
            lines.append(f"  {p}.row = getelementptr inbounds float, ptr {ap}, i64 %roff{r}")
            lines.append(f"  {p} = getelementptr inbounds float, ptr {p}.row, i64 {k_off}")
        else:
            lines.append(f"  {p} = getelementptr inbounds float, ptr {ap}, i64 {k_off * MR + r}")
        lines.append(f"  %{tag}a{r} = load float, ptr {p}, align 4")
        lines.append(f"  %{tag}ai{r} = insertelement {vt} poison, float %{tag}a{r}, i64 0")
        lines.append(f"  %{tag}as{r} = shufflevector {vt} %{tag}ai{r}, {vt} poison, <{L} x i32> zeroinitializer")
        row = []
        for v in range(NV):
            out = f"%{tag}c{r}_{v}"
            lines.append(f"  {out} = call {vt} @llvm.fma.v{L}f32({vt} %{tag}as{r}, {vt} {bs[v]}, {vt} {accs[r][v]})")
            row.append(out)
        new.append(row)
    return lines, new


def _micro_ir(name: str, cfg: GemmConfig, act: str, direct: bool) -> list[str]:
    """The micro-kernel reading A from the packed panel (k-th value of row r at
    ap[k * MR + r]) or, ``direct``, from A itself (at ap[r * lda + k])."""
    return (_micro_prologue(name, cfg, direct) + _micro_unrolled_loop(cfg, direct) + _micro_rest_loop(cfg, direct)
            + _micro_store_whole(cfg) + _micro_store_edge(cfg) + _micro_epilogue(name, act))


def _micro_prologue(name: str, cfg: GemmConfig, direct: bool) -> list[str]:
    """The micro-kernel's signature and entry (the row offsets of A when it is read in place)."""
    fname = "microd" if direct else "micro"
    micro = [f"define internal void @{name}_{fname}(ptr noalias %ap, ptr noalias %bp, i64 %kc, ptr noalias %c, i64 %ldc, "
             f"i64 %mr, i64 %nc, i1 %first, i1 %last, ptr %bias, ptr %pf, i64 %lda) alwaysinline nounwind {{",
             "entry:"]
    if direct:  # rows past mr read the last valid row again (their results are never stored)
        micro.append("  %mrl = sub i64 %mr, 1")
        for r in range(cfg.mr):
            micro.append(f"  %rlt{r} = icmp ult i64 {r}, %mr")
            micro.append(f"  %rr{r} = select i1 %rlt{r}, i64 {r}, i64 %mrl")
            micro.append(f"  %roff{r} = mul i64 %rr{r}, %lda")
    return micro


def _micro_unrolled_loop(cfg: GemmConfig, direct: bool) -> list[str]:
    """The micro-kernel's main k loop, ``unroll`` steps a trip, ending in %xacc at its exit."""
    L, MR, NR, U = cfg.lanes, cfg.mr, cfg.nr, cfg.unroll
    NV = NR // L
    vt = f"<{L} x float>"
    AK = 1 if direct else MR
    zero = "zeroinitializer"
    micro = [f"  %ku = udiv i64 %kc, {U}",
             f"  %kr = urem i64 %kc, {U}",
             "  %hasu = icmp ne i64 %ku, 0",
             "  br i1 %hasu, label %uloop, label %uexit",
             "uloop:",
             "  %ui = phi i64 [0, %entry], [%ui.n, %uloop]",
             "  %uap = phi ptr [%ap, %entry], [%uap.n, %uloop]",
             "  %ubp = phi ptr [%bp, %entry], [%ubp.n, %uloop]",
             "  %upf = phi ptr [%pf, %entry], [%upf.n, %uloop]"]
    accs = [[f"%uacc{r}_{v}" for v in range(NV)] for r in range(MR)]
    body: list[str] = []
    cur = accs
    for u in range(U):
        lines, cur = _fma_step(cfg, f"u{u}_", "%uap", "%ubp", cur, u, direct)
        if cfg.prefetch:
            body.append(f"  %upfp{u} = getelementptr inbounds float, ptr %upf, i64 {u * 16}")
            body.append(f"  call void @llvm.prefetch.p0(ptr %upfp{u}, i32 0, i32 3, i32 1)")
        body += lines
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %uacc{r}_{v} = phi {vt} [{zero}, %entry], [{cur[r][v]}, %uloop]")
    micro += body
    micro += [f"  %uap.n = getelementptr inbounds float, ptr %uap, i64 {U * AK}",
              f"  %ubp.n = getelementptr inbounds float, ptr %ubp, i64 {U * NR}",
              f"  %upf.n = getelementptr inbounds float, ptr %upf, i64 {U * 16}",
              "  %ui.n = add i64 %ui, 1",
              "  %ucont = icmp ult i64 %ui.n, %ku",
              "  br i1 %ucont, label %uloop, label %uexit",
              "uexit:",
              "  %xap = phi ptr [%ap, %entry], [%uap.n, %uloop]",
              "  %xbp = phi ptr [%bp, %entry], [%ubp.n, %uloop]"]
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %xacc{r}_{v} = phi {vt} [{zero}, %entry], [{cur[r][v]}, %uloop]")
    return micro


def _micro_rest_loop(cfg: GemmConfig, direct: bool) -> list[str]:
    """The micro-kernel's k steps left after the unrolled loop, one a trip, ending in %acc."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    AK = 1 if direct else MR
    micro = ["  %hasr = icmp ne i64 %kr, 0",
             "  br i1 %hasr, label %rloop, label %done",
             "rloop:",
             "  %ri = phi i64 [0, %uexit], [%ri.n, %rloop]",
             "  %rap = phi ptr [%xap, %uexit], [%rap.n, %rloop]",
             "  %rbp = phi ptr [%xbp, %uexit], [%rbp.n, %rloop]"]
    lines, rcur = _fma_step(cfg, "r_", "%rap", "%rbp", [[f"%racc{r}_{v}" for v in range(NV)] for r in range(MR)], 0,
                            direct)
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %racc{r}_{v} = phi {vt} [%xacc{r}_{v}, %uexit], [{rcur[r][v]}, %rloop]")
    micro += lines
    micro += [f"  %rap.n = getelementptr inbounds float, ptr %rap, i64 {AK}",
              f"  %rbp.n = getelementptr inbounds float, ptr %rbp, i64 {NR}",
              "  %ri.n = add i64 %ri, 1",
              "  %rcont = icmp ult i64 %ri.n, %kr",
              "  br i1 %rcont, label %rloop, label %done",
              "done:"]
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %acc{r}_{v} = phi {vt} [%xacc{r}_{v}, %uexit], [{rcur[r][v]}, %rloop]")
    return micro


def _micro_store_whole(cfg: GemmConfig) -> list[str]:
    """The choice of store and a whole tile's: the bias added in registers, vector stores."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    micro = [f"  %fullm = icmp eq i64 %mr, {MR}",
             f"  %fulln = icmp eq i64 %nc, {NR}",
             "  %full = and i1 %fullm, %fulln",
             # a whole tile of the last slice adds the bias in registers, before its
             # store (the epilogue's pass over the tile is then only for the activation)
             "  %hasb0 = icmp ne ptr %bias, null",
             "  %lastb = and i1 %last, %hasb0",
             "  %bfolded = and i1 %full, %lastb",
             "  br i1 %full, label %fast, label %slow",
             # the whole tile: straight vector stores; C is read only to add to it after the
             # first slice (a fresh output is never read)
             "fast:"]
    for r in range(MR):
        micro.append(f"  %fro{r} = mul i64 %ldc, {r}")
        micro.append(f"  %frow{r} = getelementptr inbounds float, ptr %c, i64 %fro{r}")
        for v in range(NV):
            micro.append(f"  %fp{r}_{v} = getelementptr inbounds float, ptr %frow{r}, i64 {v * L}")
    micro.append("  br i1 %bfolded, label %fbias, label %fgo")
    micro.append("fbias:")
    for v in range(NV):
        micro.append(f"  %fbp{v} = getelementptr inbounds float, ptr %bias, i64 {v * L}")
        micro.append(f"  %fbv{v} = load {vt}, ptr %fbp{v}, align 4")
        for r in range(MR):
            micro.append(f"  %fb{r}_{v} = fadd {vt} %acc{r}_{v}, %fbv{v}")
    micro += ["  br label %fgo", "fgo:"]
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %fa{r}_{v} = phi {vt} [%acc{r}_{v}, %fast], [%fb{r}_{v}, %fbias]")
    micro.append("  br i1 %first, label %fstore, label %fadd")
    micro.append("fstore:")
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  store {vt} %fa{r}_{v}, ptr %fp{r}_{v}, align 4")
    micro += ["  br label %epi", "fadd:"]
    for r in range(MR):
        for v in range(NV):
            micro.append(f"  %fo{r}_{v} = load {vt}, ptr %fp{r}_{v}, align 4")
            micro.append(f"  %fs{r}_{v} = fadd {vt} %fa{r}_{v}, %fo{r}_{v}")
            micro.append(f"  store {vt} %fs{r}_{v}, ptr %fp{r}_{v}, align 4")
    micro += ["  br label %epi"]
    return micro


def _micro_store_edge(cfg: GemmConfig) -> list[str]:
    """An edge tile's store: the rows below mr, each vector under the mask of its columns below nc."""
    L, MR, NR = cfg.lanes, cfg.mr, cfg.nr
    NV = NR // L
    vt = f"<{L} x float>"
    # masked loads add the C of earlier slices
    micro = ["slow:",
             "  %nc32 = trunc i64 %nc to i32",
             f"  %ncv0 = insertelement <{L} x i32> poison, i32 %nc32, i64 0",
             f"  %ncv = shufflevector <{L} x i32> %ncv0, <{L} x i32> poison, <{L} x i32> zeroinitializer"]
    for v in range(NV):
        lanes = ", ".join(f"i32 {v * L + i}" for i in range(L))
        micro.append(f"  %smask{v} = icmp ult <{L} x i32> <{lanes}>, %ncv")
    micro.append("  br label %srow0")
    for r in range(MR):
        nxt = f"%srow{r + 1}" if r + 1 < MR else "%epi"
        micro += [f"srow{r}:",
                  f"  %sin{r} = icmp ult i64 {r}, %mr",
                  f"  br i1 %sin{r}, label %sdo{r}, label %epi",
                  f"sdo{r}:",
                  f"  %sro{r} = mul i64 %ldc, {r}",
                  f"  %srp{r} = getelementptr inbounds float, ptr %c, i64 %sro{r}"]
        for v in range(NV):
            micro += [f"  %sp{r}_{v} = getelementptr inbounds float, ptr %srp{r}, i64 {v * L}",
                      f"  %so{r}_{v} = call {vt} @llvm.masked.load.v{L}f32.p0(ptr %sp{r}_{v}, i32 4, "
                      f"<{L} x i1> %smask{v}, {vt} zeroinitializer)",
                      f"  %ss{r}_{v} = fadd {vt} %acc{r}_{v}, %so{r}_{v}",
                      f"  %sv{r}_{v} = select i1 %first, {vt} %acc{r}_{v}, {vt} %ss{r}_{v}",
                      f"  call void @llvm.masked.store.v{L}f32.p0({vt} %sv{r}_{v}, ptr %sp{r}_{v}, i32 4, "
                      f"<{L} x i1> %smask{v})"]
        micro.append(f"  br label {nxt}")
    return micro


def _micro_epilogue(name: str, act: str) -> list[str]:
    """The last slice's epilogue: the bias (unless folded) and the activation over the tile, in L1."""
    return [
        "epi:",
        "  %notfolded = xor i1 %bfolded, true",
        "  %hasb = and i1 %hasb0, %notfolded",
        f"  %needb = and i1 %last, %hasb",
        f"  %needa = and i1 %last, {'true' if act != 'none' else 'false'}",
        "  %need = or i1 %needb, %needa",
        "  br i1 %need, label %erow, label %ret",
        "erow:",
        "  %ei = phi i64 [0, %epi], [%ei.n, %erow.end]",
        "  %ero = mul i64 %ei, %ldc",
        "  %ecrow = getelementptr inbounds float, ptr %c, i64 %ero",
        "  br i1 %hasb, label %ebcol, label %eacol",
        "ebcol:",
        "  %bj = phi i64 [0, %erow], [%bj.n, %ebcol]",
        "  %bcp = getelementptr inbounds float, ptr %ecrow, i64 %bj",
        "  %bcv = load float, ptr %bcp, align 4",
        "  %bbp = getelementptr inbounds float, ptr %bias, i64 %bj",
        "  %bbv = load float, ptr %bbp, align 4",
        "  %bsum = fadd float %bcv, %bbv",
        f"  %bout = call float @{name}_act(float %bsum)",
        "  store float %bout, ptr %bcp, align 4",
        "  %bj.n = add i64 %bj, 1",
        "  %bjc = icmp ult i64 %bj.n, %nc",
        "  br i1 %bjc, label %ebcol, label %erow.end",
        "eacol:",
        "  %aj = phi i64 [0, %erow], [%aj.n, %eacol]",
        "  %acp = getelementptr inbounds float, ptr %ecrow, i64 %aj",
        "  %acv = load float, ptr %acp, align 4",
        f"  %aout = call float @{name}_act(float %acv)",
        "  store float %aout, ptr %acp, align 4",
        "  %aj.n = add i64 %aj, 1",
        "  %ajc = icmp ult i64 %aj.n, %nc",
        "  br i1 %ajc, label %eacol, label %erow.end",
        "erow.end:",
        "  %ei.n = add i64 %ei, 1",
        "  %eic = icmp ult i64 %ei.n, %mr",
        "  br i1 %eic, label %erow, label %ret",
        "ret:",
        "  ret void",
        "}"]


# --- packing A: Aw[(i / MR) * kc * MR + k * MR + i % MR] = A[i, k], zero past mc --------------

def _pack_ir(name: str, cfg: GemmConfig) -> list[str]:
    """The function ``@NAME_pack`` that packs a block of A into row panels of MR rows."""
    MR = cfg.mr
    pack = [f"define internal void @{name}_pack(ptr noalias %a, i64 %lda, i64 %sk, i64 %mc, i64 %kc, ptr noalias %w) "
            "alwaysinline nounwind {",
            "entry:",
            f"  %mp = add i64 %mc, {MR - 1}",
            f"  %np = udiv i64 %mp, {MR}",
            "  br label %panel",
            "panel:",
            "  %pi = phi i64 [0, %entry], [%pi.n, %panel.end]",
            f"  %row0 = mul i64 %pi, {MR}",
            f"  %pwo = mul i64 %row0, %kc",
            "  %pw = getelementptr inbounds float, ptr %w, i64 %pwo",
            f"  %full = add i64 %row0, {MR}",
            "  %isfull = icmp ule i64 %full, %mc",
            "  br i1 %isfull, label %fk, label %pk"]
    pack += _pack_whole_panel(MR) + _pack_partial_panel(MR)
    pack += ["panel.end:",
             "  %pi.n = add i64 %pi, 1",
             "  %pic = icmp ult i64 %pi.n, %np",
             "  br i1 %pic, label %panel, label %exit",
             "exit:",
             "  ret void",
             "}"]
    return pack


def _pack_whole_panel(MR: int) -> list[str]:
    """Packing a whole panel: MR rows, read along k."""
    pack = ["fk:"]
    for r in range(MR):
        pack.append(f"  %fr{r} = add i64 %row0, {r}")
        pack.append(f"  %fro{r} = mul i64 %fr{r}, %lda")
        pack.append(f"  %frp{r} = getelementptr inbounds float, ptr %a, i64 %fro{r}")
    pack += ["  br label %fkl",
             "fkl:",
             "  %k = phi i64 [0, %fk], [%k.n, %fkl]",
             "  %ks = mul i64 %k, %sk",
             f"  %wo = mul i64 %k, {MR}"]
    for r in range(MR):
        pack.append(f"  %sp{r} = getelementptr inbounds float, ptr %frp{r}, i64 %ks")
        pack.append(f"  %sv{r} = load float, ptr %sp{r}, align 4")
        pack.append(f"  %do{r} = add i64 %wo, {r}")
        pack.append(f"  %dp{r} = getelementptr inbounds float, ptr %pw, i64 %do{r}")
        pack.append(f"  store float %sv{r}, ptr %dp{r}, align 4")
    pack += ["  %k.n = add i64 %k, 1",
             "  %kcont = icmp ult i64 %k.n, %kc",
             "  br i1 %kcont, label %fkl, label %panel.end"]
    return pack


def _pack_partial_panel(MR: int) -> list[str]:
    """Packing the last, partial panel: rows past mc are zero."""
    return ["pk:",
            "  br label %pkl",
            "pkl:",
            "  %q = phi i64 [0, %pk], [%q.n, %pkr.end]",
            f"  %qo = mul i64 %q, {MR}",
            "  br label %pkr",
            "pkr:",
            "  %r = phi i64 [0, %pkl], [%r.n, %pkr.next]",
            "  %row = add i64 %row0, %r",
            "  %in = icmp ult i64 %row, %mc",
            "  %qd = add i64 %qo, %r",
            "  %qdp = getelementptr inbounds float, ptr %pw, i64 %qd",
            "  br i1 %in, label %pkload, label %pkzero",
            "pkload:",
            "  %qso = mul i64 %row, %lda",
            "  %qks = mul i64 %q, %sk",
            "  %qso2 = add i64 %qso, %qks",
            "  %qsp = getelementptr inbounds float, ptr %a, i64 %qso2",
            "  %qv = load float, ptr %qsp, align 4",
            "  store float %qv, ptr %qdp, align 4",
            "  br label %pkr.next",
            "pkzero:",
            "  store float 0.0, ptr %qdp, align 4",
            "  br label %pkr.next",
            "pkr.next:",
            "  %r.n = add i64 %r, 1",
            f"  %rc = icmp ult i64 %r.n, {MR}",
            "  br i1 %rc, label %pkr, label %pkr.end",
            "pkr.end:",
            "  %q.n = add i64 %q, 1",
            "  %qc = icmp ult i64 %q.n, %kc",
            "  br i1 %qc, label %pkl, label %panel.end"]


# --- the driver --------------------------------------------------------------------------------

def _driver_ir(name: str, cfg: GemmConfig) -> list[str]:
    """The exported driver ``@NAME``: the loops over KC-slices, row blocks, panels and row tiles."""
    return (_driver_prologue(name, cfg) + _driver_block_loops(name, cfg) + _driver_tile_loop(name, cfg)
            + _driver_loop_ends())


def _driver_prologue(name: str, cfg: GemmConfig) -> list[str]:
    """The driver's signature and entry: the empty cases and the rows per block of A."""
    MR = cfg.mr
    return [f"define void @{name}(ptr noalias nocapture readonly %A, i64 %lda, i64 %sak, ptr noalias nocapture readonly %Bp, "
            "ptr noalias nocapture readonly %bias, ptr noalias nocapture %C, i64 %ldc, i64 %M, i64 %N, i64 %K, "
            "ptr noalias nocapture %W, i64 %plo, i64 %phi, i64 %mcx) nounwind {",
            "entry:",
            "  %empty0 = icmp eq i64 %M, 0",
            "  %empty1 = icmp eq i64 %K, 0",
            "  %empty2 = icmp uge i64 %plo, %phi",
            "  %e01 = or i1 %empty0, %empty1",
            "  %empty = or i1 %e01, %empty2",
            # no workspace: A is read where it is (its k stride must be 1), not packed
            "  %direct = icmp eq ptr %W, null",
            # rows per block: M split evenly into blocks of at most MC, rounded up to MR
            "  %mcx1 = sub i64 %mcx, 1",
            "  %nb0 = add i64 %M, %mcx1",
            "  %nb = udiv i64 %nb0, %mcx",
            "  %mper0 = add i64 %M, %nb",
            "  %mper1 = sub i64 %mper0, 1",
            "  %mper = udiv i64 %mper1, %nb",
            f"  %mcb0 = add i64 %mper, {MR - 1}",
            f"  %mcb1 = udiv i64 %mcb0, {MR}",
            f"  %mcb = mul i64 %mcb1, {MR}",
            "  br i1 %empty, label %exit, label %pc.loop"]


def _driver_block_loops(name: str, cfg: GemmConfig) -> list[str]:
    """The driver's loop heads over KC-slices, blocks of A (packed unless read in place) and B panels."""
    KC, NR = cfg.kc, cfg.nr
    return ["pc.loop:",
            "  %pc = phi i64 [0, %entry], [%pc.n, %pc.end]",
            "  %krem = sub i64 %K, %pc",
            f"  %kbig = icmp ugt i64 %krem, {KC}",
            f"  %kc = select i1 %kbig, i64 {KC}, i64 %krem",
            "  %first = icmp eq i64 %pc, 0",
            "  %pc.n = add i64 %pc, %kc",
            "  %last = icmp eq i64 %pc.n, %K",
            "  br label %ic.loop",
            "ic.loop:",
            "  %ic = phi i64 [0, %pc.loop], [%ic.n, %ic.end]",
            "  %mrem = sub i64 %M, %ic",
            "  %mbig = icmp ugt i64 %mrem, %mcb",
            "  %mc = select i1 %mbig, i64 %mcb, i64 %mrem",
            "  %aoff0 = mul i64 %ic, %lda",
            "  %aoff1 = mul i64 %pc, %sak",
            "  %aoff = add i64 %aoff0, %aoff1",
            "  %ablk = getelementptr inbounds float, ptr %A, i64 %aoff",
            "  br i1 %direct, label %ic.packed, label %ic.pack",
            "ic.pack:",
            f"  call void @{name}_pack(ptr %ablk, i64 %lda, i64 %sak, i64 %mc, i64 %kc, ptr %W)",
            "  br label %ic.packed",
            "ic.packed:",
            "  br label %p.loop",
            "p.loop:",
            "  %p = phi i64 [%plo, %ic.packed], [%p.n, %p.end]",
            f"  %col0 = mul i64 %p, {NR}",
            "  %bpo0 = mul i64 %col0, %K",
            f"  %bpo1 = mul i64 %pc, {NR}",
            "  %bpo = add i64 %bpo0, %bpo1",
            "  %bpan = getelementptr inbounds float, ptr %Bp, i64 %bpo",
            f"  %bnexto = mul i64 %K, {NR}",
            "  %bnext = getelementptr float, ptr %bpan, i64 %bnexto",
            "  %ncrem = sub i64 %N, %col0",
            f"  %ncbig = icmp ugt i64 %ncrem, {NR}",
            f"  %nc = select i1 %ncbig, i64 {NR}, i64 %ncrem",
            "  %hasb = icmp ne ptr %bias, null",
            "  %bcol = getelementptr inbounds float, ptr %bias, i64 %col0",
            "  %bptr = select i1 %hasb, ptr %bcol, ptr null",
            "  br label %ir.loop"]


def _driver_tile_loop(name: str, cfg: GemmConfig) -> list[str]:
    """The driver's loop over the row tiles of a block: the prefetch pointer and the micro-kernel call."""
    MR, NR = cfg.mr, cfg.nr
    return ["ir.loop:",
            "  %ir = phi i64 [0, %p.loop], [%ir.n, %ir.next]",
            "  %mr.rem = sub i64 %mc, %ir",
            f"  %mr.big = icmp ugt i64 %mr.rem, {MR}",
            f"  %mr = select i1 %mr.big, i64 {MR}, i64 %mr.rem",
            # the next panel is prefetched while this one is used: a micro-kernel call prefetches
            # kc consecutive cache lines, so the first NR / 16 row tiles take a share each
            # (an AVX-512 panel row is NR / 16 lines); later tiles touch this panel again
            f"  %irt = udiv i64 %ir, {MR}",
            f"  %irpf = icmp ult i64 %irt, {max(1, NR // 16)}",
            "  %pfo = mul i64 %irt, %kc",
            "  %pfo16 = shl i64 %pfo, 4",
            "  %pfn = getelementptr float, ptr %bnext, i64 %pfo16",
            "  %pfp = select i1 %irpf, ptr %pfn, ptr %bpan",
            "  %cr = add i64 %ic, %ir",
            "  %co0 = mul i64 %cr, %ldc",
            "  %co = add i64 %co0, %col0",
            "  %ctile = getelementptr inbounds float, ptr %C, i64 %co",
            "  br i1 %direct, label %ir.direct, label %ir.packed",
            "ir.packed:",
            "  %awo = mul i64 %ir, %kc",
            "  %apan = getelementptr inbounds float, ptr %W, i64 %awo",
            f"  call void @{name}_micro(ptr %apan, ptr %bpan, i64 %kc, ptr %ctile, i64 %ldc, i64 %mr, i64 %nc, "
            "i1 %first, i1 %last, ptr %bptr, ptr %pfp, i64 %lda)",
            "  br label %ir.next",
            "ir.direct:",
            "  %adro = mul i64 %ir, %lda",
            "  %adir = getelementptr inbounds float, ptr %ablk, i64 %adro",
            f"  call void @{name}_microd(ptr %adir, ptr %bpan, i64 %kc, ptr %ctile, i64 %ldc, i64 %mr, i64 %nc, "
            "i1 %first, i1 %last, ptr %bptr, ptr %pfp, i64 %lda)",
            "  br label %ir.next",
            "ir.next:",
            f"  %ir.n = add i64 %ir, {MR}",
            "  %irc = icmp ult i64 %ir.n, %mc",
            "  br i1 %irc, label %ir.loop, label %p.end"]


def _driver_loop_ends() -> list[str]:
    """The driver's loop latches, innermost first, and its return."""
    return ["p.end:",
            "  %p.n = add i64 %p, 1",
            "  %pcnt = icmp ult i64 %p.n, %phi",
            "  br i1 %pcnt, label %p.loop, label %ic.end",
            "ic.end:",
            "  %ic.n = add i64 %ic, %mc",
            "  %icc = icmp ult i64 %ic.n, %M",
            "  br i1 %icc, label %ic.loop, label %pc.end",
            "pc.end:",
            "  %pcc = icmp ult i64 %pc.n, %K",
            "  br i1 %pcc, label %pc.loop, label %exit",
            "exit:",
            "  ret void",
            "}"]


# --- running it ------------------------------------------------------------------------------


_ARGTYPES = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
             ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
             ctypes.c_int64, ctypes.c_int64]
_LOCK = threading.Lock()
_COMPILED: dict[tuple[GemmConfig, str], Any] = {}

# The parameter block of ``block_entry``, each an i64: what changes from call to call (A's,
# the packed B's, the bias's and C's addresses, C's row stride), then what changes with A's
# strides (they, the workspace, the block rows), then what is fixed (M, N, K, the panel range,
# the kernel's address).
_BLOCK_FIELDS = ["a", "bp", "bias", "c", "ldc", "lda", "sak", "ws", "mcx", "m", "n", "k", "lo", "hi", "fnv"]
_PER_CALL = struct.Struct("=5q").pack_into   # the block's first five fields, written at every call
_BLOCK_ENTRY: list = []   # [the compiled entry, or None where it did not compile]


def block_entry_ir(name: str = "pt_gemm_block") -> str:
    """The IR of ``name(ptr block)``: loads ``_BLOCK_FIELDS`` from the block and calls the
    kernel at ``fnv`` with the first 14 (one ctypes argument a call instead of 14)."""
    lines = [f"define void @{name}(ptr %d) nounwind {{", "entry:"]
    for i, f in enumerate(_BLOCK_FIELDS):
        lines += [f"  %{f}.p = getelementptr inbounds i64, ptr %d, i64 {i}", f"  %{f} = load i64, ptr %{f}.p, align 8"]
    lines += [f"  %{f}x = inttoptr i64 %{f} to ptr" for f in ("a", "bp", "bias", "c", "ws", "fnv")]
    lines += ["  call void %fnvx(ptr %ax, i64 %lda, i64 %sak, ptr %bpx, ptr %biasx, ptr %cx, i64 %ldc, i64 %m, "
              "i64 %n, i64 %k, ptr %wsx, i64 %lo, i64 %hi, i64 %mcx)", "  ret void", "}"]
    return "\n".join(lines) + "\n"


def block_entry() -> Any:
    """The compiled ``pt_gemm_block(block)`` (compiled once a process), or None where it did
    not compile (the kernel is then called with its 14 arguments)."""
    with _LOCK:
        if not _BLOCK_ENTRY:
            try:
                _BLOCK_ENTRY.append(jit().kernel("pt_gemm_block", block_entry_ir(), 0, argtypes=[ctypes.c_void_p]).fn)
            except Exception:
                _BLOCK_ENTRY.append(None)
        return _BLOCK_ENTRY[0]

# Below this many multiply-adds a call stays on one thread (handing work to a pool thread costs
# some 20 microseconds).
PARALLEL_MIN_MACS = 1 << 22


def config(m: int | None = None, n: int | None = None) -> GemmConfig:
    """The tile for an [m, n] result on this CPU (the default tile when no shape is given)."""
    if m is None or n is None:
        return gemm_config(vector_width())
    return choose(m, n, vector_width())


def kernel(act: str = "none", cfg: GemmConfig | None = None) -> Any:
    """The compiled GEMM for ``act`` and the tile ``cfg`` on this CPU (compiled once a process,
    cached on disk)."""
    cfg = cfg or config()
    key = (cfg, act)
    with _LOCK:
        fn = _COMPILED.get(key)
        if fn is None:
            name = f"pt_gemm_{cfg.mr}x{cfg.nr}_{act}"
            fn = _COMPILED[key] = jit().kernel(name, gemm_ir(name, cfg, act), 0, argtypes=_ARGTYPES).fn
        return fn


import os as _os

DIRECT_A = _os.environ.get("PARTITA_GEMM_DIRECT_A", "auto")


def read_a_in_place(lda: int) -> bool:
    """Whether a row-major A (k stride 1, rows ``lda`` floats apart) is read where it is
    instead of packed per block. Packing costs a pass over A per KC x MC block, some 8% of a
    GEMM with 256 columns; reading in place costs nothing unless the rows are a multiple of
    4 KiB apart, when all MR rows fall into one set of the 8-way L1 and evict each other (2 to
    5% slower than packing, measured with K = 1024 and 4096 on AMD EPYC Zen 4)."""
    if DIRECT_A in ("0", "1"):
        return DIRECT_A == "1"
    return lda % 1024 != 0


def pack_b(b: Any, nr: int | None = None) -> Any:
    """``b`` [K, N] (any strides, a transposed weight's view included) as the kernel's panels
    [ceil(N / nr), K, nr], contiguous, the last panel's missing columns zero."""
    nr = nr or config().nr
    k, n = b.shape
    np_ = -(-n // nr)
    if np_ * nr != n:
        b = torch.nn.functional.pad(b, (0, np_ * nr - n))
    return b.reshape(k, np_, nr).permute(1, 0, 2).contiguous()


def direct_block_rows(cfg: GemmConfig, k: int) -> int:
    """The most rows of an A read in place per block: as many as fill half of L2 with one
    KC-slice (so each B panel, streamed from memory, serves that many rows), at least ``cfg.mc``."""
    rows = (l2_bytes() // 2) // (4 * min(k, cfg.kc) or 1)
    return max(cfg.mc, rows // cfg.mr * cfg.mr)


def gemm(a: Any, packed: Any, n: int, bias: Any = None, act: str = "none", out: Any = None,
         cfg: GemmConfig | None = None) -> Any:
    """``act(a @ B + bias)`` for a 2-d f32 ``a`` [M, K] (any strides) and ``packed =
    pack_b(B, cfg.nr)``; the result is a new contiguous [M, N] tensor, or ``out``. With more
    than one torch thread and enough work, the panels of B are split between threads."""
    cfg = cfg or config()
    m, k = a.shape
    c = out if out is not None else torch.empty((m, n), dtype=torch.float32)
    if m == 0 or n == 0:
        return c
    if k == 0:  # no products: the bias and the activation, as the library's ATen epilogue runs them
        from .aten_fallback import aten_epilogue

        c.zero_()
        if bias is not None:
            c += bias
        c.copy_(aten_epilogue(c, "none", None, act))
        return c
    return PreparedGemm(m, n, k, act, cfg)(a, packed, bias, c)


class PreparedGemm:
    """One node's GEMM, fixed when the executor prepares the node: the shape [m, k] x [k, n],
    the tile, the activation, the compiled kernel and its workspaces. A call does only what
    depends on the operands (their addresses and strides): they are written into a parameter
    block set up here (the shape, the panels, the kernel's address), and the kernel is entered
    through ``block_entry`` with that block's one address, so the Python around the kernel is
    about a microsecond; ``gemm`` is the same computation for any shape. Like the program that
    holds it, one call at a time (the workspaces and the block are reused)."""

    __slots__ = ("m", "n", "k", "act", "cfg", "fn", "np", "ws", "ws_ptr", "parallel", "direct", "mcd",
                 "blk", "blk_addr", "entry", "strides")

    def __init__(self, m: int, n: int, k: int, act: str = "none", cfg: GemmConfig | None = None) -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"partita.codegen.gemm: no activation {act!r} (known: {', '.join(ACTIVATIONS)})")
        self.m, self.n, self.k, self.act = m, n, k, act
        self.cfg = cfg = cfg or config(m, n)
        self.fn: Any = kernel(act, cfg) if m and n and k else None
        self.np = -(-n // cfg.nr)
        self.ws = torch.empty(cfg.workspace, dtype=torch.float32)  # thread i's at i * cfg.workspace
        self.ws_ptr = self.ws.data_ptr()
        self.parallel = m * n * k >= PARALLEL_MIN_MACS and self.np > 1
        self.direct = DIRECT_A != "0"
        self.mcd = direct_block_rows(cfg, k)
        # The block: _BLOCK_FIELDS, the shape, the panel range and the kernel's address set here.
        self.entry = block_entry() if self.fn is not None else None
        fnv = 0 if self.fn is None else ctypes.cast(self.fn, ctypes.c_void_p).value or 0
        self.blk = (ctypes.c_int64 * len(_BLOCK_FIELDS))(0, 0, 0, 0, 0, 0, 0, 0, 0, m, n, k, 0, self.np, fnv)
        self.blk_addr = ctypes.addressof(self.blk)
        self.strides: tuple = ()   # the A strides the block's workspace and block rows were set for

    def pack(self, b: Any) -> Any:
        """``b`` [k, n] as this GEMM's packed panels."""
        return pack_b(b, self.cfg.nr)

    def __call__(self, a: Any, packed: Any, bias: Any = None, out: Any = None) -> Any:
        """``act(a @ B + bias)`` for ``a`` [m, k] (any strides) and ``packed = self.pack(B)``."""
        m, n = self.m, self.n
        c = torch.empty((m, n), dtype=torch.float32) if out is None else out
        if self.fn is None:
            return gemm(a, packed, n, bias, self.act, c, self.cfg)
        sa = a.stride()
        self.call_kernel(a.data_ptr(), sa[0], sa[1], packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                         c.data_ptr(), c.stride(0))
        return c

    def rows(self, x: Any, packed: Any, bias: Any, out: Any, out_shape: tuple) -> Any:
        """``act(x @ B + bias)`` for ``x`` [..., k] (its leading dimensions the m rows) into
        ``out`` (contiguous, ``out_shape`` = [..., n]) or a new tensor of ``out_shape``: the
        linear step's call. A contiguous ``x`` is read where it is (no reshape); a contiguous
        ``bias`` or none."""
        if self.fn is None:
            y = self(x.reshape(self.m, self.k), packed, bias, None if out is None else out.view(self.m, self.n))
            return y.view(out_shape) if out is None else out
        c = torch.empty(out_shape, dtype=torch.float32) if out is None else out
        if x.is_contiguous():
            ap, lda, sak = x.data_ptr(), self.k, 1
        else:
            x2 = x.reshape(self.m, self.k)
            sa = x2.stride()
            ap, lda, sak = x2.data_ptr(), sa[0], sa[1]
        self.call_kernel(ap, lda, sak, packed.data_ptr(), 0 if bias is None else bias.data_ptr(), c.data_ptr(),
                         self.n)
        return c

    def native_entry(self, x: Any, packed: Any, bias: Any, out: Any) -> tuple[int, int] | None:
        """(``block_entry``'s address, the block's) where ``rows(x, packed, bias, out, ...)`` on
        one thread is that entry on the block as its last call left it (``x`` None: whatever
        input that call read), else None: what codegen/step_chain.py calls in its place."""
        blk = self.blk
        if self.entry is None or out is None or self.strides != (self.k, 1):
            return None
        if x is not None:
            if not x.is_contiguous() or blk[0] != x.data_ptr() or (bias is not None and not bias.is_contiguous()) \
                    or blk[2] != (0 if bias is None else bias.data_ptr()):
                return None
        if blk[1] != packed.data_ptr() or blk[3] != out.data_ptr() or blk[4] != self.n:
            return None
        return ctypes.cast(self.entry, ctypes.c_void_p).value or 0, self.blk_addr

    def call_kernel(self, a: int, lda: int, sak: int, bp: int, bias: int, c: int, ldc: int) -> None:
        """Run the kernel on these addresses and strides (bias 0: none): split between threads
        where the work is large enough, else through the parameter block."""
        if self.parallel:
            nt = min(torch.get_num_threads(), self.np)
            if nt > 1:
                self._parallel(nt, (a, lda, sak, bp, bias or None, c, ldc, self.m, self.n, self.k))
                return
        blk = self.blk
        if self.strides != (lda, sak):
            direct = self.direct and sak == 1 and read_a_in_place(lda)
            blk[5], blk[6] = lda, sak
            blk[7] = 0 if direct else self.ws_ptr
            blk[8] = self.mcd if direct else self.cfg.mc
            self.strides = (lda, sak)
        entry = self.entry
        if entry is not None:
            _PER_CALL(blk, 0, a, bp, bias, c, ldc)
            entry(self.blk_addr)
        else:
            self.fn(a, lda, sak, bp, bias, c, ldc, self.m, self.n, self.k, blk[7], 0, self.np, blk[8])

    def _parallel(self, nt: int, args: tuple) -> None:
        direct = self.direct and args[2] == 1 and read_a_in_place(args[1])
        wsf = self.cfg.workspace
        if not direct and self.ws.numel() < nt * wsf:
            self.ws = torch.empty(nt * wsf, dtype=torch.float32)
            self.ws_ptr = self.ws.data_ptr()
            self.strides = ()   # the block's workspace address is set again at its next use
        ws = 0 if direct else self.ws_ptr
        mc = self.mcd if direct else self.cfg.mc
        omp = _omp_launcher()
        if omp is not None:
            fields = [0 if x is None else int(x) for x in args]
            fields += [ws, 4 * wsf, self.np, mc, ctypes.cast(self.fn, ctypes.c_void_p).value or 0]
            data = (ctypes.c_int64 * 15)(*fields)
            omp(ctypes.addressof(data), nt)
            return
        fn, np_ = self.fn, self.np
        bounds = [np_ * i // nt for i in range(nt + 1)]
        pool = kernel_pool(nt - 1)
        futs = [pool.submit(fn, *(args + (None if direct else ws + 4 * wsf * i, bounds[i], bounds[i + 1], mc)))
                for i in range(1, nt)]
        fn(*args, None if direct else ws, bounds[0], bounds[1], mc)
        for f in futs:
            f.result()


# --- threads: the GEMM's split on torch's OpenMP team (the launchers are codegen/cpu.py's) -------

# The GEMM's launcher: data = the driver's arguments with the workspace's base and bytes per
# thread, the panel count and the driver's address; thread tid takes its share of the panels and
# its slice of the workspace (none when A is read in place).
_GEMM_FIELDS = ["a", "lda", "sak", "bp", "bias", "c", "ldc", "m", "n", "k", "ws", "wsb", "np", "mcx", "fnv"]
_GEMM_BODY = ["  %hasws = icmp ne i64 %ws, 0",
              "  %wso = mul i64 %tid, %wsb",
              "  %ws1 = add i64 %ws, %wso",
              "  %wsv = select i1 %hasws, i64 %ws1, i64 0",
              *(f"  %{f}x = inttoptr i64 %{f} to ptr" for f in ("a", "bp", "bias", "c", "wsv"))]
_GEMM_CALL = ("ptr %ax, i64 %lda, i64 %sak, ptr %bpx, ptr %biasx, ptr %cx, i64 %ldc, i64 %m, i64 %n, i64 %k, "
              "ptr %wsvx, i64 %lo, i64 %hi, i64 %mcx")

# Set to False, this makes the GEMM's split use the Python pool, as where libgomp is missing (tests).
_OMP: Any = None


def _omp_launcher() -> Any:
    """``pt_gemm_omp(data, nthreads)``, or None (the Python pool splits)."""
    if _OMP is False:
        return None
    return launcher(LAUNCHERS, "pt_gemm_omp",
                     lambda: launcher_ir("pt_gemm_omp", _GEMM_FIELDS, "np", _GEMM_BODY, _GEMM_CALL))
