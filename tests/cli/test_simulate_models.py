"""``partita simulate`` as a user runs it: named models (``--model``, ``--list-models``),
transformers configs (``--hf-config``), ``--seq``/``--batch``, the summary's one unit style,
the per-layer trace, and a clear message for each bad model flag (in process through
``partita.cli.main``, small shapes)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from partita.cli import main
from partita.cli.simulate import HF_TYPES
from partita.cluster.simulator import format_bytes, layer_of
from partita.models import NAMED_MODELS, named_model
from partita.models.named import HF_DECODERS, MEGATRON_TABLE1_MODELS

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128,
              "vocab_size": 256, "max_position_embeddings": 64, "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
TINY = ["--seq", "16", "--batch", "8", "--dtype", "f32"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    rc = main(argv)
    cap = capsys.readouterr()
    assert "Traceback" not in cap.err
    return rc, cap.out, cap.err


def _params(g) -> int:
    return sum(v.type.numel for v in g.inputs if v.role == "param")


def test_list_models_names_every_model_with_its_size_and_defaults(capsys):
    rc, out, _ = _run(["simulate", "--list-models"], capsys)
    assert rc == 0
    for name in ("gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b", "megatron-1.7b", "megatron-1008b"):
        assert re.search(rf"^{re.escape(name)}\s+[\d.]+B\s", out, re.MULTILINE), name
    assert re.search(r"^llama3-8b\s+8\.0B\s+32\s+4096\s+32/8\s+8192\s+512", out, re.MULTILINE), out
    assert len(NAMED_MODELS) >= 14 and sum(n.startswith("megatron-") for n in NAMED_MODELS) == 10


@pytest.mark.parametrize("name", sorted(NAMED_MODELS))
def test_each_named_config_builds_its_published_parameter_count(name):
    m = NAMED_MODELS[name]
    g = m.build(batch=1)
    assert _params(g) == m.params()
    published = {"gpt3-175b": 175e9, "llama3-8b": 8.0e9, "llama3-70b": 70.6e9, "llama3-405b": 406e9}
    if name.startswith("megatron-"):     # the paper's figure, to the digits it prints
        size = name.removeprefix("megatron-").removesuffix("b")
        assert f"{m.params() / 1e9:.{len(size.partition('.')[2])}f}" == size
    else:
        assert m.params() == pytest.approx(published[name], rel=0.01)


def test_named_models_simulate_end_to_end_with_seq_and_batch(tmp_path: Path, capsys):
    rc, out, err = _run(["simulate", "--model", "megatron-1.7b", *TINY, "--mesh", "dp=2,tp=2"], capsys)
    assert rc == 0, err
    assert "model megatron-1.7b: 1.65B parameters, seq 16, batch 8" in out
    assert "128 tokens per step" in out and "mesh(dp=2, tp=2)" in out
    rc, out, err = _run(["simulate", "--model", "LLAMA3-8B", *TINY, "--mesh", "pp=2,dp=2", "--microbatches", "2"],
                        capsys)
    assert rc == 0, err
    assert "model llama3-8b: 8.03B parameters, seq 16, batch 8" in out and "simulated step on selene" in out


def test_an_hf_config_builds_and_simulates(tmp_path: Path, capsys):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(TINY_LLAMA))
    rc, out, err = _run(["simulate", "--hf-config", str(cfg), "--mesh", "dp=2", "--batch", "4"], capsys)
    assert rc == 0, err
    # 2 layers of norms 2*64, q/o 2*64^2, k/v 2*64*32, MLP 3*64*128; embed and head 2*256*64; final norm 64.
    params = 2 * (128 + 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 2 * 256 * 64 + 64
    assert f"model config: {params / 1e9:.3g}B parameters, seq 64, batch 4" in out, out
    qwen = dict(TINY_LLAMA, model_type="qwen2", tie_word_embeddings=True)
    cfg.write_text(json.dumps(qwen))
    rc, out, err = _run(["simulate", "--hf-config", str(cfg), "--seq", "8"], capsys)
    assert rc == 0, err
    assert "biases are not built" in out and "untied" in out
    gpt2 = {"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256, "n_positions": 32}
    cfg.write_text(json.dumps(gpt2))
    rc, out, err = _run(["simulate", "--hf-config", str(cfg), "--batch", "2"], capsys)
    assert rc == 0, err
    assert "seq 32, batch 2" in out
    assert set(HF_TYPES) == set(HF_DECODERS)


def test_the_summary_has_one_unit_style(capsys):
    rc, out, err = _run(["simulate", "--model", "megatron-1.7b", *TINY, "--mesh", "pp=2,dp=2", "--microbatches", "2",
                         "--unroll"], capsys)
    assert rc == 0, err
    summary = out[out.index("simulated step on"):]
    assert not re.search(r"\de[+-]\d", summary), summary
    assert not re.search(r"\d (kB|MB|GB|TB|PB)\b", summary), summary
    sizes = re.findall(r"\b([\d.]+) (B|KiB|MiB|GiB|TiB)\b", summary)
    assert len(sizes) >= 10 and all(len(n.replace(".", "").lstrip("0")) <= 3 for n, u in sizes if u != "B"), sizes
    assert re.search(r"peak memory", summary) and re.search(r"communication per step: dp [\d.]+ \w+B", summary)
    assert [format_bytes(x) for x in (0, 999, 1000, 1536, 100 * 2 ** 20, 80 * 2 ** 30, 10.79e12)] == \
        ["0 B", "999 B", "0.977 KiB", "1.50 KiB", "100 MiB", "80.0 GiB", "9.81 TiB"]


def test_the_default_trace_is_per_layer_and_much_smaller(tmp_path: Path, capsys):
    small, full = tmp_path / "layers.json", tmp_path / "ops.json"
    base = ["simulate", "--gpt", "4,64,4,16,128,8", "--dtype", "f32", "--mesh", "pp=2,dp=2", "--microbatches", "2",
            "--unroll"]
    assert _run([*base, "--trace", str(small)], capsys)[0] == 0
    assert _run([*base, "--trace", str(full), "--trace-detail"], capsys)[0] == 0
    assert full.stat().st_size > 5 * small.stat().st_size
    spans = [e for e in json.loads(small.read_text())["traceEvents"] if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"transformer.h.0", "transformer.h.3"} <= names and not names & {"matmul", "add", "layer_norm"}
    assert all(e["args"]["ops"] >= 1 for e in spans)
    ops = {e["name"] for e in json.loads(full.read_text())["traceEvents"] if e["ph"] == "X"}
    assert "matmul" in ops
    assert layer_of("model.layers.12.mlp.up_proj (recompute)") == "model.layers.12 (recompute)"
    assert layer_of("lm_head") == "lm_head" and layer_of("transformer.ln_f") == "transformer.ln_f"


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama9-1t"], r"--model: no model named 'llama9-1t'; the named models are gpt3-175b, .*llama3-8b"),
    (["--model", "llama3-8b", "--gpt", "2,64,4,16,128,8"], r"--gpt and --model each give the model; give one"),
    (["m.pir", "--model", "llama3-8b"], r"FILE.pir and --model each give the model"),
    (["--model", "llama3-8b", "--hf-config", "c.json"], r"--model and --hf-config each give the model"),
    (["--model", "llama3-8b", "--seq", "0"], r"--seq 0: the sequence length must be at least 1"),
    (["--model", "llama3-8b", "--batch", "-3"], r"--batch -3: the batch must be at least 1"),
    (["--gpt", "2,64,4,16,128,8", "--seq", "8"], r"--seq applies to --model and --hf-config; --gpt gives its own"),
    (["--model", "llama3-8b", "--batch", str(10 ** 12)], r"--model llama3-8b: .* tokens a step, beyond any model"),
    (["--hf-config", "missing.json"], r"--hf-config missing.json: no such file"),
    (["--hf-config", "bad.json"], r"--hf-config bad.json: not JSON"),
    (["--hf-config", "bert.json"], r"model_type 'bert' is not a decoder the builders cover; supported model types: "
                                   r"llama, mistral, qwen2, gpt2"),
    (["--hf-config", "list.json"], r"the config is a JSON list"),
    (["--hf-config", "nolayers.json"], r"the config has no 'num_hidden_layers'"),
    (["--hf-config", "heads.json"], r"llama: hidden=64 must be a multiple of heads=5"),
    (["--model", "llama3-8b", "--trace-detail"], r"--trace-detail is a --trace option"),
])
def test_bad_model_flags_are_one_clear_message(argv, message, tmp_path: Path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.json").write_text("{model_type: llama")
    (tmp_path / "bert.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "nolayers.json").write_text(json.dumps({k: v for k, v in TINY_LLAMA.items()
                                                         if k != "num_hidden_layers"}))
    (tmp_path / "heads.json").write_text(json.dumps(dict(TINY_LLAMA, num_attention_heads=5, num_key_value_heads=5)))
    rc, _out, err = _run(["simulate", *argv], capsys)
    assert rc == 1 and re.search(message, err), err


def test_named_model_lookup_lists_the_names():
    assert named_model(" Llama3-70B ").layers == 80
    with pytest.raises(Exception, match="the named models are gpt3-175b"):
        named_model("gpt4")


def test_the_megatron_models_are_the_benchmarks_rows():
    """The shared table and bench/bench_simulate.py's Table 1 agree on every row's shape."""
    import sys

    bench = Path(__file__).resolve().parents[2] / "bench"
    sys.path.insert(0, str(bench))
    try:
        import bench_simulate
    finally:
        sys.path.remove(str(bench))
    rows = [(name, a, h, l, B) for name, a, h, l, _tp, _pp, _n, B, *_rest in bench_simulate.MEGATRON_T1]
    assert rows == [tuple(r) for r in MEGATRON_TABLE1_MODELS]
    for name, a, h, l, B in rows:
        m = NAMED_MODELS[f"megatron-{name.lower()}"]
        assert (m.heads, m.hidden, m.layers, m.batch, m.seq, m.vocab) == (a, h, l, B, bench_simulate.SEQ,
                                                                           bench_simulate.VOCAB)


def test_a_small_cp_and_pp_plan_simulates_from_the_command_line(tmp_path: Path, capsys):
    """A small Llama config on dp=2,pp=2,cp=2,tp=2 with zero2 and the interleaved schedule:
    the command the Llama 3 CP16 row is simulated with, small. Its sequence (8) is as long
    as the rotary frequency index (head_dim / 2), which cp must not take for positions."""
    cfg = tmp_path / "tiny.json"
    cfg.write_text(json.dumps(dict(TINY_LLAMA, num_hidden_layers=4)))
    argv = ["simulate", "--hf-config", str(cfg), "--seq", "8", "--batch", "16", "--mesh", "dp=2,pp=2,cp=2,tp=2",
            "--strategy", "pp+zero2+megatron+cp", "--master-weights", "--microbatches", "4", "--schedule",
            "interleaved", "--virtual-stages", "2", "--cluster", "dgx-h100"]
    rc, out, _err = _run(argv, capsys)
    assert rc == 0 and "seq 8, batch 16" in out and "simulated in" in out


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama3-8b", "--seq", "20", "--batch", "4", "--mesh", "cp=4", "--strategy", "cp"],
     r"--model llama3-8b: the sequence length 20 is not a multiple of 2 x cp = 8 \(--mesh cp=4: .*use a sequence of "
     r"16 or 24 \(--seq\), or a cp axis that divides it \(cp=2\)"),
    (["--model", "llama3-8b", "--seq", "4", "--batch", "4", "--mesh", "cp=4", "--strategy", "cp-ring"],
     r"the sequence length 4 is not a multiple of 2 x cp = 8 .*use a sequence of 8 \(--seq\), or a cp axis"),
    (["--gpt", "2,64,4,20,128,8", "--mesh", "cp=4,tp=2", "--strategy", "cp+megatron"],
     r"--gpt '2,64,4,20,128,8': the sequence length 20 is not a multiple of 2 x cp = 8 .*\(the S of --gpt"),
    (["--hf-config", "nomt.json"], r"--hf-config nomt.json: the config has no 'model_type' .*supported model types: "
                                   r"llama, mistral, qwen2, gpt2"),
    (["--hf-config", "t5.json"], r"model_type 't5' is not a decoder the builders cover; supported model types"),
    (["--model", "llama3-8b", "--mesh", "dp=32", "--cluster", "dgx-h100", "--nodes", "2"],
     r"--mesh dp=32 needs 32 devices, but --cluster dgx-h100 --nodes 2 has 16 \(2 nodes x 8\); use --nodes 4"),
    (["--model", "llama3-8b", "--mesh", "dp=2,tp=16", "--cluster", "dgx-h100", "--nodes", "4"],
     r"the tensor-parallel axis tp=16 .* more than the 8 devices of a node of 'dgx-h100'.*at most 8 wide"),
    (["--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", str(10 ** 9)], r"--nodes 1000000000: cluster "
                                                                                   r"'dgx-h100' takes 1 to"),
])
def test_bad_plans_are_one_clear_message_before_the_model_is_built(argv, message, tmp_path: Path, capsys,
                                                                   monkeypatch):
    """A sequence the cp axis does not split into 2 x cp chunks, a config that is no decoder
    the builders know, a mesh the cluster's nodes cannot hold: each names the value and the
    fix, before any model is built."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nomt.json").write_text(json.dumps({k: v for k, v in TINY_LLAMA.items() if k != "model_type"}))
    (tmp_path / "t5.json").write_text(json.dumps({"model_type": "t5", "d_model": 64, "num_layers": 2}))
    rc, out, err = _run(["simulate", *argv], capsys)
    assert rc == 1 and re.search(message, err), err
    assert "built in" not in out


def test_grad_sums_gemm_prices_a_pipelines_gradient_sums_in_the_gemm(capsys):
    """--grad-sums gemm drops the per-microbatch gradient adds of a pipeline (a shorter step);
    with --unroll it is refused with the reason."""
    argv = ["simulate", "--gpt", "4,256,4,128,1000,8", "--mesh", "pp=2,dp=2", "--microbatches", "4"]

    def step_ms(extra: list[str]) -> float:
        assert main(argv + extra) == 0
        out = capsys.readouterr().out
        m = re.search(r"simulated step on .*: ([0-9.]+) ms", out)
        assert m, out
        return float(m.group(1))

    assert step_ms(["--grad-sums", "gemm"]) < step_ms([])
    assert main(argv + ["--unroll", "--grad-sums", "gemm"]) != 0
    assert "unroll=False" in capsys.readouterr().err


def test_fusion_eager_prices_the_uncompiled_chains_and_bad_names_are_refused(capsys):
    """--fusion eager prices what uncompiled PyTorch runs as chains of kernels (a longer step);
    an op with no known chain is one clear error naming the ops that have one."""
    argv = ["simulate", "--gpt", "4,256,4,128,1000,8", "--mesh", "dp=2"]

    def step_ms(extra: list[str]) -> float:
        assert main(argv + extra) == 0
        out = capsys.readouterr().out
        m = re.search(r"simulated step on .*: ([0-9.]+) ms", out)
        assert m, out
        return float(m.group(1))

    assert step_ms(["--fusion", "eager"]) > step_ms([])
    # Fused elementwise groups: on by default for a compiled step, off on request.
    assert step_ms(["--fused-groups", "off"]) > step_ms([]) == step_ms(["--fused-groups", "on"])
    assert step_ms(["--fusion", "eager"]) == step_ms(["--fusion", "eager", "--fused-groups", "off"])
    assert main(argv + ["--fusion", "rms_norm,bogus"]) != 0
    err = capsys.readouterr().err
    assert "bogus" in err and "rms_norm" in err and "Traceback" not in err
