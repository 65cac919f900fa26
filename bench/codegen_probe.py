"""Probe for choosing partita's code generator (see docs/codegen-choice.md).

Self-contained: not imported by the package or the tests. It measures one fused kernel, the
elementwise chain on a [256, 4096] float32 tensor (12 x clamp(-2, 2), mul 1.01, add 0.1),
written as one loop and built four ways:

  cpp       C++ built by the system compiler (g++ -O3 -march=native -fopenmp
            -ffp-contract=off), loaded with ctypes; OpenMP for more than one thread
  llvm      LLVM IR through llvmlite (O3 pipeline, loop vectorizer, host CPU), MCJIT;
            for more than one thread, chunks on Python threads (ctypes drops the GIL)
  eager     the same chain as 36 torch ops
  inductor  torch.compile (Inductor) of the eager chain

Run:  .venv/bin/python bench/codegen_probe.py [--rounds N]
llvmlite is optional; from a throwaway install: PYTHONPATH=/tmp/cgllvm .venv/bin/python ...
(where `pip install --target /tmp/cgllvm llvmlite` put it).
"""
from __future__ import annotations

import argparse
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

CXX = os.environ.get("CXX", "g++")
CXXFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-shared", "-fPIC"]
SHAPE = (256, 4096)
REPS = 12
LO, HI, MUL, ADD = -2.0, 2.0, 1.01, 0.1


# ---------------------------------------------------------------- generated sources

def cpp_source(tag: str = "") -> str:
    body = "\n".join(
        f"        v = v < {LO}f ? {LO}f : (v > {HI}f ? {HI}f : v);\n"
        f"        v = v * {MUL}f;\n"
        f"        v = v + {ADD}f;"
        for _ in range(REPS)
    )
    return f"""// fused elementwise chain {tag}
#include <cstdint>
extern "C" void kernel(const float* __restrict x, float* __restrict out, int64_t n, int nt) {{
    #pragma omp parallel for simd num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i) {{
        float v = x[i];
{body}
        out[i] = v;
    }}
}}
"""


def cpp_intrin_source(tag: str = "") -> str:
    # The same chain with AVX2 intrinsics: max_ps(lo, v) / min_ps(hi, v) return v when v is
    # NaN (x86 returns the second operand), so NaN propagates as in torch.clamp.
    vec = "\n".join(
        f"            v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));\n"
        f"            v = _mm256_mul_ps(v, mul);\n"
        f"            v = _mm256_add_ps(v, add);"
        for _ in range(REPS))
    return f"""// fused elementwise chain, intrinsics {tag}
#include <cstdint>
#include <immintrin.h>
extern "C" void kernel(const float* __restrict x, float* __restrict out, int64_t n, int nt) {{
    const int64_t nv = n / 8;
    #pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t b = 0; b < nv; ++b) {{
        const __m256 lo = _mm256_set1_ps({LO}f), hi = _mm256_set1_ps({HI}f);
        const __m256 mul = _mm256_set1_ps({MUL}f), add = _mm256_set1_ps({ADD}f);
        __m256 v = _mm256_loadu_ps(x + 8 * b);
{vec}
        _mm256_storeu_ps(out + 8 * b, v);
    }}
    for (int64_t i = nv * 8; i < n; ++i) {{
        float v = x[i];
        for (int r = 0; r < {REPS}; ++r) {{
            v = v < {LO}f ? {LO}f : (v > {HI}f ? {HI}f : v);
            v = v * {MUL}f;
            v = v + {ADD}f;
        }}
        out[i] = v;
    }}
}}
"""


def llvm_source(tag: str = "") -> str:
    lines = []
    v = "%x0"
    for r in range(REPS):
        lines += [
            f"  %lt{r} = fcmp olt float {v}, {LO:e}",
            f"  %gt{r} = fcmp ogt float {v}, {HI:e}",
            f"  %hi{r} = select i1 %gt{r}, float {HI:e}, float {v}",
            f"  %cl{r} = select i1 %lt{r}, float {LO:e}, float %hi{r}",
            f"  %mu{r} = fmul float %cl{r}, {_f32_hex(MUL)}",
            f"  %ad{r} = fadd float %mu{r}, {_f32_hex(ADD)}",
        ]
        v = f"%ad{r}"
    body = "\n".join(lines)
    return f"""; fused elementwise chain {tag}
define void @kernel(ptr noalias nocapture readonly %x, ptr noalias nocapture %out, i64 %lo, i64 %hi) {{
entry:
  %empty = icmp sge i64 %lo, %hi
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ %lo, %entry ], [ %next, %loop ]
  %px = getelementptr inbounds float, ptr %x, i64 %i
  %x0 = load float, ptr %px, align 4
{body}
  %po = getelementptr inbounds float, ptr %out, i64 %i
  store float {v}, ptr %po, align 4
  %next = add nsw i64 %i, 1
  %done = icmp eq i64 %next, %hi
  br i1 %done, label %exit, label %loop
exit:
  ret void
}}
"""


def _f32_hex(value: float) -> str:
    # LLVM spells a float constant as the double that the float rounds to, in hex.
    import struct
    as_f32 = struct.unpack("f", struct.pack("f", value))[0]
    return "0x%016X" % struct.unpack("Q", struct.pack("d", as_f32))[0]


# ---------------------------------------------------------------- C++ build and cache

def compiler_id() -> str:
    return subprocess.run([CXX, "--version"], capture_output=True, text=True).stdout.splitlines()[0]


def build_so(src: str, out_path: str) -> float:
    with tempfile.NamedTemporaryFile("w", suffix=".cpp", delete=False) as f:
        f.write(src)
    t0 = time.perf_counter()
    subprocess.run([CXX, *CXXFLAGS, f.name, "-o", out_path], check=True)
    dt = time.perf_counter() - t0
    os.unlink(f.name)
    return dt


def cache_key(src: str) -> str:
    return hashlib.sha256("\0".join([src, compiler_id(), *CXXFLAGS]).encode()).hexdigest()


def get_or_build(src: str, cache_dir: str, key: str | None = None) -> tuple[ctypes.CDLL, bool]:
    """Content-hash cache: <cache_dir>/<sha256>.so. Returns (library, compiled_here).

    Hit: one stat and a dlopen, no lock. Miss: an exclusive flock on <key>.lock, a second
    look (another process may have built it while we waited), a build to a temporary name
    and an atomic os.replace, so a reader never sees a half-written file. An entry that
    fails to load is removed and rebuilt once."""
    key = key or cache_key(src)
    so = os.path.join(cache_dir, key + ".so")
    if os.path.exists(so):
        try:
            return ctypes.CDLL(so), False
        except OSError:
            os.unlink(so)
    os.makedirs(cache_dir, exist_ok=True)
    with open(os.path.join(cache_dir, key + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(so):
            return ctypes.CDLL(so), False
        tmp = f"{so}.tmp{os.getpid()}"
        build_so(src, tmp)
        os.replace(tmp, so)
    return ctypes.CDLL(so), True


def bind_cpp(lib: ctypes.CDLL):
    fn = lib.kernel
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    fn.restype = None
    return fn


# ---------------------------------------------------------------- llvmlite

def llvm_compile(src: str, state: dict):
    import llvmlite.binding as llvm

    t0 = time.perf_counter()
    if "tm" not in state:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        state["tm"] = target.create_target_machine(
            cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
        state["engines"] = []
    tm = state["tm"]
    t1 = time.perf_counter()
    mod = llvm.parse_assembly(src)
    mod.verify()
    t2 = time.perf_counter()
    pto = llvm.create_pipeline_tuning_options(speed_level=3)
    pto.loop_vectorization = True
    pto.slp_vectorization = True
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    t3 = time.perf_counter()
    engine = llvm.create_mcjit_compiler(mod, tm)
    engine.finalize_object()
    addr = engine.get_function_address("kernel")
    t4 = time.perf_counter()
    state["engines"].append(engine)  # keep the code alive
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(addr)
    return fn, {"init": t1 - t0, "parse": t2 - t1, "optimize": t3 - t2, "codegen": t4 - t3,
                "total": t4 - t0}, str(mod), tm


# ---------------------------------------------------------------- torch

def chain(x):
    for _ in range(REPS):
        x = x.clamp(LO, HI)
        x = x * MUL
        x = x + ADD
    return x


def fresh_chain():
    # a new code object each time, so dynamo compiles again rather than reusing its cache
    ns: dict = {}
    exec(compile("def chain(x):\n"
                 f"    for _ in range({REPS}):\n"
                 f"        x = x.clamp({LO}, {HI})\n"
                 f"        x = x * {MUL}\n"
                 f"        x = x + {ADD}\n"
                 "    return x\n", f"<chain {time.perf_counter_ns()}>", "exec"), ns)
    return ns["chain"]


def child_inductor(nt: int, cache_dir: str) -> None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    t_import = time.perf_counter()
    import torch
    t_import = time.perf_counter() - t_import
    torch.set_num_threads(nt)
    x = torch.randn(*SHAPE)
    f = torch.compile(chain)
    t0 = time.perf_counter()
    f(x)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    f(x)
    second = time.perf_counter() - t0
    print(json.dumps({"first_call": first, "steady_call": second, "import_torch": t_import}))


def child_load(so: str) -> None:
    t0 = time.perf_counter()
    fn = bind_cpp(ctypes.CDLL(so))
    print(json.dumps({"load": time.perf_counter() - t0}))


def child_cache(cache_dir: str, out_json: str) -> None:
    src = cpp_source("cache-probe")
    t0 = time.perf_counter()
    key = cache_key(src)  # sha256 of source + `g++ --version` (a subprocess) + flags
    t1 = time.perf_counter()
    lib, compiled = get_or_build(src, cache_dir, key)
    bind_cpp(lib)
    t2 = time.perf_counter()
    with open(out_json, "w") as f:
        json.dump({"pid": os.getpid(), "compiled": compiled, "seconds": t2 - t0,
                   "key_s": t1 - t0, "lookup_load_s": t2 - t1}, f)


# ---------------------------------------------------------------- main

def med(xs):
    return statistics.median(xs)


def run_child(*args, env=None):
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--calls", type=int, default=5, help="calls per candidate per round")
    ap.add_argument("--child", nargs="*")
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        {"inductor": lambda: child_inductor(int(rest[0]), rest[1]),
         "load": lambda: child_load(rest[0]),
         "cache": lambda: child_cache(rest[0], rest[1])}[kind]()
        return

    work = tempfile.mkdtemp(prefix="codegen_probe.")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(work, "inductor_main")
    import torch
    import torch._inductor.config as inductor_config

    res: dict = {"env": {
        "python": sys.version.split()[0], "torch": torch.__version__, "cxx": compiler_id(),
        "cxxflags": " ".join(CXXFLAGS), "cpus": os.cpu_count()}}
    try:
        import llvmlite
        import llvmlite.binding as llvm
        res["env"]["llvmlite"] = f"{llvmlite.__version__} (LLVM {'.'.join(map(str, llvm.llvm_version_info))})"
    except ImportError:
        llvm = None
        res["env"]["llvmlite"] = None
    print(json.dumps(res["env"]), flush=True)

    # ---- C++: cold compile (5 builds), load of a cached .so (fresh processes and in-process)
    src = cpp_source()
    so = os.path.join(work, "chain.so")
    cold = [build_so(cpp_source(f"#{i}"), so) for i in range(5)]
    res["cpp_compile_s"] = med(cold)
    res["cpp_compile_serial_s"] = med(
        [_build_flags(cpp_source(f"s{i}"), os.path.join(work, "s.so"), drop="-fopenmp") for i in range(3)])
    loads_fresh = [run_child("--child", "load", so)["load"] for _ in range(10)]
    res["cpp_load_fresh_process_s"] = med(loads_fresh)
    copies = []
    for i in range(10):
        p = os.path.join(work, f"copy{i}.so")
        shutil.copy(so, p)
        copies.append(p)
    ctypes.CDLL(so)  # libgomp and friends already mapped, as in a running process
    inproc = []
    for p in copies:
        t0 = time.perf_counter()
        bind_cpp(ctypes.CDLL(p))
        inproc.append(time.perf_counter() - t0)
    res["cpp_load_in_process_s"] = med(inproc)
    cpp = bind_cpp(ctypes.CDLL(so))
    so_i = os.path.join(work, "chain_intrin.so")
    res["cpp_intrin_compile_s"] = med([build_so(cpp_intrin_source(f"#{i}"), so_i) for i in range(3)])
    cpp_i = bind_cpp(ctypes.CDLL(so_i))
    print("cpp compile/load", res["cpp_compile_s"], res["cpp_load_fresh_process_s"],
          res["cpp_load_in_process_s"], flush=True)

    # ---- cache across processes: 2 processes race on an empty cache, then 10 hits
    cdir = os.path.join(work, "kcache")
    outs = [os.path.join(work, f"race{i}.json") for i in range(2)]
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, __file__, "--child", "cache", cdir, o]) for o in outs]
    for p in procs:
        p.wait()
    race_wall = time.perf_counter() - t0
    race = [json.load(open(o)) for o in outs]
    hits = []
    for i in range(10):
        o = os.path.join(work, f"hit{i}.json")
        subprocess.run([sys.executable, __file__, "--child", "cache", cdir, o], check=True)
        hits.append(json.load(open(o)))
    res["cache_race"] = {"compiled": [r["compiled"] for r in race],
                         "seconds": [r["seconds"] for r in race], "wall": race_wall,
                         "files": sorted(os.listdir(cdir))}
    res["cache_hit_s"] = med([h["seconds"] for h in hits])
    res["cache_hit_key_s"] = med([h["key_s"] for h in hits])
    res["cache_hit_lookup_load_s"] = med([h["lookup_load_s"] for h in hits])
    res["cache_hits_all_hit"] = not any(h["compiled"] for h in hits)
    t0 = time.perf_counter()
    for _ in range(1000):
        cache_key(src)
    res["cache_key_s_with_cxx_version"] = (time.perf_counter() - t0) / 1000
    t0 = time.perf_counter()
    for _ in range(1000):
        hashlib.sha256(src.encode()).hexdigest()
    res["sha256_of_source_s"] = (time.perf_counter() - t0) / 1000
    print("cache", res["cache_race"], res["cache_hit_s"], flush=True)

    # ---- llvmlite: compile times (first includes target init), vectorization check
    llvm_fn = None
    if llvm is not None:
        state: dict = {}
        llvm_fn, first, ir, tm = llvm_compile(llvm_source(), state)
        later = [llvm_compile(llvm_source(f"#{i}"), state)[1] for i in range(10)]
        res["llvm_compile_first"] = first
        res["llvm_compile_s"] = {k: med([t[k] for t in later]) for k in later[0]}
        asm = tm.emit_assembly(llvm.parse_assembly(ir))
        res["llvm_vector_regs"] = {r: asm.count(r) for r in ("%zmm", "%ymm", "%xmm")}
        print("llvm", res["llvm_compile_first"], res["llvm_compile_s"], res["llvm_vector_regs"], flush=True)
    asm = subprocess.run(f"objdump -d {so} | grep -c zmm; objdump -d {so} | grep -c ymm", shell=True,
                         capture_output=True, text=True).stdout.split()
    res["cpp_vector_regs"] = {"%zmm": int(asm[0]), "%ymm": int(asm[1])}

    # ---- run time, interleaved, per thread count
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(2)
    x = torch.randn(*SHAPE) * 3
    n = x.numel()
    ref = chain(x)
    res["runs"] = {}
    for nt in (1, 2):
        torch.set_num_threads(nt)
        inductor_config.cpp.threads = nt
        f_ind = torch.compile(fresh_chain())
        t0 = time.perf_counter()
        f_ind(x)
        res[f"inductor_first_call_in_probe_nt{nt}_s"] = time.perf_counter() - t0
        out = torch.empty_like(x)

        def run_cpp(nt=nt, out=out):
            cpp(x.data_ptr(), out.data_ptr(), n, nt)
            return out

        def run_cpp_i(nt=nt, out=out):
            cpp_i(x.data_ptr(), out.data_ptr(), n, nt)
            return out

        def run_llvm(nt=nt, out=out):
            if nt == 1:
                llvm_fn(x.data_ptr(), out.data_ptr(), 0, n)
            else:
                h = n // 2
                list(pool.map(lambda r: llvm_fn(x.data_ptr(), out.data_ptr(), *r), [(0, h), (h, n)]))
            return out

        cands = {"eager": lambda: chain(x), "inductor": lambda: f_ind(x), "cpp": run_cpp, "cpp_intrin": run_cpp_i}
        if llvm_fn is not None:
            cands["llvm"] = run_llvm
        check = {}
        for name, fn in cands.items():
            y = fn()
            check[name] = {"bitwise_equal_to_eager": bool(torch.equal(y, ref)),
                           "max_abs_diff": float((y - ref).abs().max())}
            for _ in range(3):
                fn()
        times = {k: [] for k in cands}
        order = list(cands)
        for r in range(a.rounds):
            for name in order[r % len(order):] + order[:r % len(order)]:
                fn = cands[name]
                t0 = time.perf_counter()
                for _ in range(a.calls):
                    fn()
                times[name].append((time.perf_counter() - t0) / a.calls)
        res["runs"][nt] = {"median_s": {k: med(v) for k, v in times.items()}, "check": check}
        print(nt, json.dumps(res["runs"][nt]), flush=True)
    torch.set_num_threads(os.cpu_count())

    # ---- Inductor cold and warm compile in fresh processes (own cache dir each)
    ind_dir = os.path.join(work, "inductor_child")
    cold = run_child("--child", "inductor", "1", ind_dir)
    warm = run_child("--child", "inductor", "1", ind_dir)
    res["inductor_cold_first_call_s"] = cold["first_call"]
    res["inductor_warm_first_call_s"] = warm["first_call"]
    res["import_torch_s"] = cold["import_torch"]
    print(json.dumps(res, indent=1, default=str))
    shutil.rmtree(work, ignore_errors=True)
    sys.stdout.flush()
    # skip interpreter teardown: with MCJIT engines alive it has crashed (SIGSEGV) at exit
    os._exit(0)


def _build_flags(src: str, out_path: str, drop: str) -> float:
    global CXXFLAGS
    saved = CXXFLAGS
    CXXFLAGS = [f for f in CXXFLAGS if f != drop]
    try:
        return build_so(src.replace("num_threads(nt)", ""), out_path)
    finally:
        CXXFLAGS = saved


if __name__ == "__main__":
    main()
