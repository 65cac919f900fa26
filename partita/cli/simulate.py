"""``partita simulate``: one step of a parallel program on a cluster on paper.

The model is a ``.pir`` file (``FILE.pir``; a forward graph is made a training step with
``--train``), a GPT built from its config without weights (``--gpt
LAYERS,HIDDEN,HEADS,SEQ,VOCAB,BATCH``), a named config (``--model llama3-8b``;
``--list-models``) or a transformers decoder config (``--hf-config config.json``), the last two
sized by ``--seq`` and ``--batch``. It is parallelized with ``--mesh`` and ``--strategy``
(and the pipeline flags), then simulated on ``--cluster`` (a shipped name or a ``.toml``
file): the step time, tokens/s, MFU and HFU, each simulated rank's time and memory, the
communication per axis; ``--trace`` writes the timeline as a Chrome trace (Perfetto), one span
per layer run (``--trace-detail``: per op).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ..ir.diagnostics import PartitaError
from .common import check_output_path, int_arg


class SimulateError(PartitaError):
    """A simulate command that cannot start (the message says what to change)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("simulate", parents=[common], help="simulate one parallel step on a cluster on paper",
                       description="Parallelize a model and simulate one step of its per-rank programs on a cluster "
                                   "described by a cluster file: step time, tokens/s, MFU/HFU, memory per rank.")
    s.add_argument("file", metavar="FILE.pir", nargs="?", help="the model (or give --gpt, --model or --hf-config)")
    s.add_argument("--gpt", metavar="L,H,A,S,V,B",
                   help="a GPT from its config, no weights: layers, hidden, heads, sequence, vocab, batch")
    s.add_argument("--model", metavar="NAME", help="a named config, no weights (e.g. llama3-8b, gpt3-175b; "
                                                    "--list-models lists them)")
    s.add_argument("--list-models", action="store_true", help="list the named models and exit")
    s.add_argument("--hf-config", metavar="CONFIG.json",
                   help="a transformers decoder config (model_type " + ", ".join(HF_TYPES) + "), no weights")
    s.add_argument("--seq", type=int, help="with --model or --hf-config: the sequence length (default the model's)")
    s.add_argument("--batch", type=int, help="with --model or --hf-config: the global batch in sequences "
                                             "(default the model's)")
    s.add_argument("--dtype", default="bf16", help="with --gpt, --model or --hf-config: the model dtype "
                                                   "(default bf16)")
    s.add_argument("--cluster", default="selene", help="a shipped cluster (see 'partita cluster') or a .toml file "
                                                       "(default selene)")
    s.add_argument("--nodes", type=int_arg(1), help="use this many nodes of the cluster's kind")
    s.add_argument("--mesh", default="dp=1", help="device mesh, e.g. pp=2,dp=4,tp=8 (default dp=1)")
    s.add_argument("--strategy", default=None,
                   help="e.g. pp+dp+megatron, zero3 (default: from the mesh axes, pp -> pp, dp -> dp, tp -> megatron, "
                        "ep -> ep; 'none' for no strategy)")
    s.add_argument("--train", choices=("adamw", "sgd"), default="adamw",
                   help="optimizer of the training step made from a forward graph (default adamw)")
    s.add_argument("--master-weights", action="store_true", help="mixed precision: f32 master weights and moments")
    s.add_argument("--recompute", choices=("none", "cheap", "selective", "full"), default="none",
                   help="activation recomputation (default none)")
    s.add_argument("--microbatches", type=int_arg(1), help="pipeline microbatches")
    s.add_argument("--schedule", help="gpipe, 1f1b (default), interleaved or zero-bubble")
    s.add_argument("--virtual-stages", type=int_arg(1), help="model chunks per pp rank (schedule interleaved)")
    s.add_argument("--grad-sums", choices=("add", "gemm"), default="add",
                   help="a pipeline's per-microbatch weight-gradient sums: a separate add (default, as "
                        "Megatron-LM 2021 ran them) or in the epilogue of the GEMM computing each gradient "
                        "(gradient-accumulation fusion, on by default in Megatron-LM since 2022); not with --unroll")
    s.add_argument("--fusion", default="fused", metavar="fused|eager|OP,OP",
                   help="how the run being priced fuses: fused (default: each op one kernel, as partita "
                        "runs it), eager (uncompiled PyTorch: RMSNorm, cross-entropy and a foreach AdamW as "
                        "their chains of kernels), or a comma list of those ops priced eager")
    s.add_argument("--fused-groups", choices=("auto", "on", "off"), default="auto",
                   help="price each chain of elementwise ops the code generator's fusion pass groups as one "
                        "memory pass: auto (default) on for --fusion fused unless the cluster file says its "
                        "runtime runs no fused groups (fused_groups = false, as partita calibrate writes), "
                        "on, or off (every op its own kernel)")
    s.add_argument("--every-rank", action="store_true", help="simulate every rank, not alike ranks once")
    s.add_argument("--check-memory", action="store_true",
                   help="fail when a rank exceeds its device's memory (a pipeline's stages walked in schedule order, "
                        "not unrolled)")
    s.add_argument("--unroll", action="store_true",
                   help="a pipeline: unroll every microbatch into per-rank programs, for each rank's memory and a "
                        "per-op trace (its time grows with the microbatches; by default a pipeline is simulated "
                        "section by section, each stage's one-microbatch template priced once)")
    s.add_argument("--trace", metavar="OUT.json", help="write the timeline as a Chrome trace (Perfetto): one span "
                                                       "per layer run on each rank's stream")
    s.add_argument("--trace-detail", action="store_true", help="with --trace: one span per op")
    s.add_argument("--html", metavar="OUT.html", help="write one HTML page of the program, its schedule and the "
                                                     "simulated timeline (partita view; docs/view.md)")
    s.add_argument("--open", action="store_true", help="with --html: open the page in a browser when one exists")
    s.set_defaults(handler=cmd_simulate)


# The transformers model types --hf-config builds (partita.models.named.HF_DECODERS).
HF_TYPES = ("llama", "mistral", "qwen2", "gpt2")
_GPT_FIELDS = ("layers", "hidden", "heads", "seq", "vocab", "batch")
# A GPT whose weights alone pass this many parameters is not one anybody trains (1T is 10^12).
MAX_GPT_PARAMS = 10 ** 15


def _gpt(text: str, dtype: str, cp: int | None = None) -> Any:
    """The GPT of ``--gpt L,H,A,S,V,B``, its numbers checked before anything is built."""
    from ..models import ModelError, gpt

    parts = text.split(",")
    try:
        nums = [int(x) for x in parts]
    except ValueError:
        nums = []
    if len(nums) != 6:
        raise SimulateError(f"--gpt '{text:.60}': give six whole numbers, layers,hidden,heads,seq,vocab,batch "
                            "(e.g. 24,2304,24,2048,51200,8)")
    for name, n in zip(_GPT_FIELDS, nums):
        if n < 1:
            raise SimulateError(f"--gpt '{text:.60}': {name} must be at least 1, got {n}")
    layers, hidden, heads, seq, vocab, batch = nums
    params = layers * 12 * hidden * hidden + (vocab + seq) * hidden
    if params > MAX_GPT_PARAMS or batch * seq > 10 ** 12:
        raise SimulateError(f"--gpt '{text:.60}': about {params:.3g} parameters and {batch * seq:.3g} tokens a step, "
                            f"beyond any model partita simulates (at most {MAX_GPT_PARAMS:.0e} parameters, 1e12 tokens)")
    check_cp_sequence(seq, cp, f"--gpt '{text:.60}'", "the S of --gpt L,H,A,S,V,B")
    try:
        return gpt(layers, hidden, heads, seq, vocab, batch=batch, dtype=dtype)
    except ModelError as e:
        raise SimulateError(f"--gpt '{text}': {e}") from None


def list_models() -> str:
    """The table ``--list-models`` prints: each named model's parameters and defaults."""
    from ..models import NAMED_MODELS

    lines = [f"{'name':<18} {'params':>8} {'layers':>6} {'hidden':>6} {'heads':>9} {'seq':>5} {'batch':>5}  source"]
    for m in NAMED_MODELS.values():
        heads = f"{m.heads}" + (f"/{m.kv_heads}" if m.kv_heads else "")
        lines.append(f"{m.name:<18} {m.params() / 1e9:>7.1f}B {m.layers:>6} {m.hidden:>6} {heads:>9} {m.seq:>5} "
                     f"{m.batch:>5}  {m.source}")
    lines.append("(heads: attention/key-value; seq and batch are the defaults, --seq and --batch override them)")
    return "\n".join(lines)


def check_cp_sequence(seq: int, cp: int | None, what: str, flag: str = "--seq") -> None:
    """A sequence the cp axis splits: a multiple of 2 x cp (each cp rank holds two of the
    ``2 * cp`` balanced chunks, for cp and cp-ring alike), checked before the model is built."""
    if cp is None or cp < 1 or seq % (2 * cp) == 0:
        return
    step = 2 * cp
    below, above = seq // step * step, (seq // step + 1) * step
    near = f"{below} or {above}" if below else f"{above}"
    fits = [c for c in range(cp - 1, 0, -1) if seq % (2 * c) == 0]
    other = f", or a cp axis that divides it (cp={fits[0]})" if fits and fits[0] > 1 else ""
    raise SimulateError(f"{what}: the sequence length {seq} is not a multiple of 2 x cp = {step} (--mesh cp={cp}: "
                        f"each of the {cp} cp ranks holds two of {step} equal chunks, one early and one late); "
                        f"use a sequence of {near} ({flag}){other}")


def check_mesh_on_cluster(mesh: Any, cluster: Any, args: argparse.Namespace) -> None:
    """A mesh the cluster's nodes can hold, said in the command's flags (--mesh, --nodes)."""
    if mesh.size <= cluster.devices:
        return
    need = -(-mesh.size // cluster.gpus_per_node)
    where = f"--cluster {args.cluster}" + (f" --nodes {args.nodes}" if args.nodes is not None else "")
    raise SimulateError(f"--mesh {args.mesh} needs {mesh.size} devices, but {where} has {cluster.devices} "
                        f"({cluster.nodes} node{'s' if cluster.nodes != 1 else ''} x {cluster.gpus_per_node}); use "
                        f"--nodes {need} (nodes of {cluster.gpus_per_node} devices) or a smaller mesh")


def _check_model_flags(args: argparse.Namespace) -> None:
    """Exactly one model source, and --seq/--batch only where they apply and at least 1."""
    given = [f for f, v in (("FILE.pir", args.file), ("--gpt", args.gpt), ("--model", args.model),
                            ("--hf-config", args.hf_config)) if v is not None]
    if not given:
        raise SimulateError("simulate: give a model, either FILE.pir or --gpt LAYERS,HIDDEN,HEADS,SEQ,VOCAB,BATCH, "
                            "or --model NAME (--list-models lists them) or --hf-config CONFIG.json")
    if len(given) > 1:
        raise SimulateError(f"simulate: {' and '.join(given)} each give the model; give one of them")
    for flag in ("seq", "batch"):
        n = getattr(args, flag)
        if n is None:
            continue
        if args.model is None and args.hf_config is None:
            raise SimulateError(f"--{flag} applies to --model and --hf-config; "
                                f"{'--gpt gives its own' if args.gpt else 'a .pir file has its shapes'}")
        if n < 1:
            raise SimulateError(f"--{flag} {n}: the {'sequence length' if flag == 'seq' else 'batch'} must be at "
                                "least 1")


def _hf_config(path: str) -> Any:
    """The NamedModel of ``--hf-config path``, with its notes printed."""
    import json

    from ..models import ModelError, hf_config_model

    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise SimulateError(f"--hf-config {path}: no such file (give a transformers config.json)") from None
    except IsADirectoryError:
        raise SimulateError(f"--hf-config {path}: a folder, not a config file (give its config.json)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise SimulateError(f"--hf-config {path}: cannot read it: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise SimulateError(f"--hf-config {path}: not JSON ({e.msg} at line {e.lineno}); give a transformers "
                            "config.json") from None
    stem = path.replace("\\", "/").rstrip("/").split("/")[-1].removesuffix(".json")
    try:
        m, notes = hf_config_model(cfg, name=stem)
    except ModelError as e:
        raise SimulateError(f"--hf-config {path}: {e}") from None
    for n in notes:
        print(f"note: {path}: {n}")
    return m


def _named(args: argparse.Namespace, cp: int | None = None) -> Any:
    """The weightless forward graph of ``--model`` or ``--hf-config``, sized by --seq/--batch."""
    from ..models import ModelError, named_model

    if args.model is not None:
        try:
            m = named_model(args.model)
        except ModelError as e:
            raise SimulateError(f"--model: {e} (--list-models shows their sizes)") from None
        what = f"--model {m.name}"
    else:
        m = _hf_config(args.hf_config)
        what = f"--hf-config {args.hf_config}"
    seq = m.seq if args.seq is None else args.seq
    batch = m.batch if args.batch is None else args.batch
    params = m.params(seq)
    if params > MAX_GPT_PARAMS or batch * seq > 10 ** 12:
        raise SimulateError(f"{what}: about {params:.3g} parameters and {batch * seq:.3g} tokens a step, beyond any "
                            f"model partita simulates (at most {MAX_GPT_PARAMS:.0e} parameters, 1e12 tokens); lower "
                            "--seq or --batch")
    check_cp_sequence(seq, cp, what)
    try:
        fwd = m.build(seq=seq, batch=batch, dtype=args.dtype)
    except ModelError as e:
        raise SimulateError(f"{what}: {e}") from None
    print(f"model {m.name}: {params / 1e9:.3g}B parameters, seq {seq}, batch {batch}")
    return fwd


def _model(args: argparse.Namespace, strategy: str, cp: int | None = None) -> Any:
    """The training step to parallelize (``cp``: the size of the strategy's cp axis, which
    the sequence must suit)."""
    from .. import training_step
    from ..parallel.pipeline.build import is_training

    _check_model_flags(args)
    if args.gpt is not None:
        fwd = _gpt(args.gpt, args.dtype, cp)
    elif args.model is not None or args.hf_config is not None:
        fwd = _named(args, cp)
    else:
        from ..ir.parser import parse_file
        from ..ir.verifier import verify

        fwd = parse_file(args.file)
        verify(fwd)
        if not fwd.outputs:
            raise SimulateError(f"{args.file}: @{fwd.name} returns nothing; simulate needs a model whose first output "
                                "is its loss (a scalar) or its logits")
        if is_training(fwd):
            return fwd
    if "megatron" in strategy:
        from ..passes.split_projections import split_projections

        split_projections(fwd)
    out0 = fwd.outputs[0]
    loss: Any = 0 if out0.type.shape == () else "cross_entropy"
    opts: dict[str, Any] = {"recompute": args.recompute}
    if args.master_weights:
        opts["master_weights"] = True
    return training_step(fwd, loss=loss, optimizer=args.train, **opts)


def _fusion_arg(text: str) -> str | tuple[str, ...]:
    """``--fusion``: ``fused``, ``eager`` or a comma list of op names (checked by ``simulate``)."""
    return text if text in ("fused", "eager") else tuple(t.strip() for t in text.split(",") if t.strip())


def cmd_simulate(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster, simulate
    from ..cluster.hardware import ClusterError
    from ..cluster.simulator import check_fits_cluster
    from ..ir.mesh import Mesh
    from ..parallel.strategies import default_strategy, parse_strategy
    from ..parallel.strategy import parallelize

    if args.list_models:
        print(list_models())
        return 0
    # Everything checked before any work: the model flags, the cluster, the mesh on it, the
    # strategy, the paths.
    _check_model_flags(args)
    if args.trace_detail and args.trace is None:
        raise SimulateError("--trace-detail is a --trace option: add --trace OUT.json")
    cluster = load_cluster(args.cluster)
    if args.nodes is not None:
        try:
            cluster = cluster.with_nodes(args.nodes)
        except ClusterError as e:
            raise SimulateError(f"--nodes {args.nodes}: {str(e).split(': ', 1)[-1]}") from None
    mesh = Mesh.of(args.mesh)
    check_mesh_on_cluster(mesh, cluster, args)
    check_fits_cluster(mesh, cluster)
    strategy = args.strategy
    if strategy is None:
        strategy = default_strategy(mesh)
        print(f"strategy {strategy} (from the mesh axes; --strategy chooses another)")
    parsed = parse_strategy(strategy, mesh)
    pp = "pp" in parsed
    cps = parsed.member("context-parallel")
    cp_axis = parsed.axis_of(cps.name) if cps is not None else None
    cp = mesh.axis_size(cp_axis) if cp_axis is not None else None
    pipeline: dict[str, Any] = {k: getattr(args, k) for k in ("microbatches", "schedule", "virtual_stages")
                                if getattr(args, k) is not None}
    if pipeline and not pp:
        raise SimulateError(f"--{next(iter(pipeline)).replace('_', '-')} is a pipeline flag, but strategy {strategy} has "
                            "no pp; add a pp axis to --mesh (e.g. --mesh pp=2,dp=4)")
    if args.trace is not None:
        check_output_path(args.trace, "--trace")
    if args.html is not None:
        check_output_path(args.html, "--html")
    t0 = time.perf_counter()
    step = _model(args, strategy, cp)
    t1 = time.perf_counter()
    print(f"model @{step.name}: {sum(1 for _ in step.nodes)} nodes, built in {t1 - t0:.2f} s")
    unroll = args.unroll
    if pp and not unroll:
        pipeline["unroll"] = False
    prog = parallelize(step, mesh, strategy, **pipeline)
    t2 = time.perf_counter()
    print(f"parallelize for {prog.mesh} with {prog.strategy}: {t2 - t1:.2f} s")
    res = simulate(prog, cluster, dedup=not args.every_rank,
                   trace=args.trace is not None or args.html is not None,
                   check_memory=args.check_memory, grad_sums=args.grad_sums,
                   fusion=_fusion_arg(args.fusion), progress=print,
                   fuse_groups={"auto": None, "on": True, "off": False}[args.fused_groups])
    print(f"simulated in {time.perf_counter() - t2:.2f} s\n")
    print(res.text())
    if pp and not unroll and not args.check_memory:
        print("(peak memory -: not computed for a pipeline simulated section by section; --check-memory walks "
              "each stage's program in schedule order for it" + (", and so does the page (--html): below)"
                                                                  if args.html else ")"))
    if args.trace:
        try:
            res.chrome_trace(args.trace, detail=args.trace_detail)
        except OSError as e:
            raise SimulateError(f"--trace {args.trace}: cannot write the timeline: {e.strerror or e}") from None
        print(f"\nwrote the timeline to {args.trace} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if args.html:
        from .view import write_view

        data = write_view(prog, args.html, sim=res, open_it=args.open)
        if pp and not unroll and not args.check_memory:
            print("\n".join(stage_memory_lines(data)))
    return 0


def stage_memory_lines(data: dict) -> list[str]:
    """Each pp stage's peak memory, as the page walked it from the stage's template."""
    from ..cluster.simulator import format_bytes

    curves = (data.get("memory") or {}).get("ranks") or []
    out = ["peak memory per stage (walked for the page, from each stage's template):"]
    for k, c in enumerate(curves):
        if k == 16 and len(curves) > 17:
            out.append(f"  ... {len(curves) - 16} more stages")
            break
        out.append(f"  stage {k:>3} (rank {c['rank']}, {c['count']} alike): {format_bytes(c['peak'])} at {c['peak_node']}")
    return out if curves else []
