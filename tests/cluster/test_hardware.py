"""Hardware as data (partita/cluster/hardware.py): the shipped cluster files load with the
data sheets' figures, quantities parse with their units, and a bad file is refused naming
the file, the line and the field."""

from __future__ import annotations

import pytest

from partita.cluster import ClusterError, list_clusters, load_cluster, parse_cluster, parse_quantity

GOOD = '''
name = "mine"
nodes = 2
gpus_per_node = 4

[device]
name = "X1"
memory = "24 GiB"
memory_bandwidth = "900 GB/s"

[device.peak_flops]
bf16 = "100 TFLOP/s"
f32 = 25e12

[intra_node]
bandwidth = "100 GB/s"
latency = "2 us"

[inter_node]
bandwidth = "100 Gb/s"
latency = "10 us"
'''


def test_every_shipped_cluster_loads():
    names = list_clusters()
    assert {"selene", "dgx-a100-40gb", "dgx-h100", "dgx-h200"} <= set(names)
    for name in names:
        c = load_cluster(name)
        assert c.devices == c.nodes * c.gpus_per_node and c.sources
        assert c.inter_node.bandwidth < c.intra_node.bandwidth


def test_selene_is_what_the_papers_and_data_sheets_say():
    s = load_cluster("selene")
    assert s.devices == 3072 and s.gpus_per_node == 8
    assert s.device.flops("bf16") == 312e12 and s.device.memory == 80 * 2 ** 30
    assert s.device.memory_bandwidth == 2039e9
    assert s.intra_node.bandwidth == 300e9            # 600 GB/s NVLink, both directions together
    assert s.inter_node.bandwidth == 200e9 / 8        # one 200 Gb/s HDR HCA per GPU
    h = load_cluster("dgx-h100")
    assert h.device.flops("bf16") == pytest.approx(989.4e12) and h.device.memory_bandwidth == 3.35e12
    assert load_cluster("dgx-h200").device.memory == 141e9


def test_a_group_inside_a_node_uses_nvlink_and_across_nodes_the_network():
    c = parse_cluster(GOOD)
    assert c.link([0, 1, 2, 3]) is c.intra_node
    assert c.link([3, 4]) is c.inter_node
    assert c.link([0, 4]).time(1e9) == pytest.approx(10e-6 + 1e9 / 12.5e9)
    with pytest.raises(ClusterError, match="rank 8 is outside the cluster 'mine' of 8 devices"):
        c.link([0, 8])
    assert c.with_nodes(16).devices == 64


@pytest.mark.parametrize("text,kind,value", [
    ("80 GiB", "bytes", 80 * 2 ** 30), ("40 GB", "bytes", 40e9), (1024, "bytes", 1024.0),
    ("2039 GB/s", "bandwidth", 2039e9), ("200 Gb/s", "bandwidth", 25e9), ("1.5 TB/s", "bandwidth", 1.5e12),
    ("312 TFLOP/s", "flops", 312e12), ("19.5 TFLOPS", "flops", 19.5e12),
    ("5 us", "time", 5e-6), ("1.5 ms", "time", 1.5e-3), ("0 s", "time", 0.0),
])
def test_quantities_parse_with_their_units(text, kind, value):
    assert parse_quantity(text, kind) == pytest.approx(value)


@pytest.mark.parametrize("edit,message", [
    (("nodes = 2\n", ""), r"<cluster>: the field nodes is missing \(a positive whole number\)"),
    (('memory = "24 GiB"', 'memory = "-24 GiB"'), r"<cluster>:\d+: \[device\] memory: '-24 GiB' is not a number"),
    (('memory = "24 GiB"', "memory = -3"), r"<cluster>:8: \[device\] memory must be positive, got -3"),
    (('memory_bandwidth = "900 GB/s"', 'memory_bandwidth = "900 GB"'),
     r"<cluster>:9: \[device\] memory_bandwidth: '900 GB': the unit 'GB' is not a bandwidth unit"),
    (('latency = "2 us"', 'latency = "2 parsecs"'), r"<cluster>:\d+: \[intra_node\] latency: '2 parsecs': the unit 'parsecs' is not a time unit"),
    (("gpus_per_node = 4", "gpus_per_node = 4.5"), r"<cluster>:4: gpus_per_node must be a whole number"),
    (("gpus_per_node = 4", "gpus_per_nodes = 4"), r"<cluster>:4: unknown field gpus_per_nodes \(did you mean 'gpus_per_node'\?\)"),
    (('bf16 = "100 TFLOP/s"', 'bf61 = "100 TFLOP/s"'), r"<cluster>:12: unknown dtype 'bf61'.*did you mean 'bf16'"),
    (("[inter_node]", "[internode]"), r"unknown field internode \(did you mean 'inter_node'\?\)"),
    (("name = \"X1\"", "name = \"\""), r"<cluster>:7: \[device\] name must be a non-empty string"),
    (("latency = \"10 us\"", "latency = \"10 us"), r"<cluster>: not valid TOML"),
])
def test_a_bad_file_names_the_line_and_the_field(edit, message):
    old, new = edit
    assert old in GOOD
    with pytest.raises(ClusterError, match=message):
        parse_cluster(GOOD.replace(old, new, 1))


def test_an_unknown_name_lists_the_shipped_clusters(tmp_path):
    with pytest.raises(ClusterError, match=r"no cluster named 'selen' \(did you mean 'selene'\?\).*dgx-h100"):
        load_cluster("selen")
    with pytest.raises(ClusterError, match=r"cannot read the cluster file"):
        load_cluster(tmp_path / "missing.toml")
    p = tmp_path / "mine.toml"
    p.write_text(GOOD)
    assert load_cluster(p).source == str(p) and load_cluster(str(p)).name == "mine"


def test_a_dtype_the_device_does_not_list_is_an_error():
    with pytest.raises(ClusterError, match=r"device 'X1' lists no peak FLOP/s for f8; it lists bf16, f32"):
        parse_cluster(GOOD).device.flops("f8")


def test_the_efficiency_table_is_optional_parsed_and_checked():
    from partita.cluster import Efficiency

    assert parse_cluster(GOOD).efficiency == Efficiency()
    c = parse_cluster(GOOD + '\n[efficiency]\ngemm = 0.7\ngemm_knee = 128\nop_overhead = "4 us"\n')
    assert c.efficiency.gemm == 0.7 and c.efficiency.gemm_knee == 128
    assert c.efficiency.op_overhead == pytest.approx(4e-6) and c.efficiency.memory == Efficiency().memory
    with pytest.raises(ClusterError, match=r"<cluster>:\d+: \[efficiency\] gemm must be a fraction in \(0, 1\], got 1.5"):
        parse_cluster(GOOD + "\n[efficiency]\ngemm = 1.5\n")
    with pytest.raises(ClusterError, match=r"unknown field \[efficiency\] gem .*did you mean 'gemm'"):
        parse_cluster(GOOD + "\n[efficiency]\ngem = 0.5\n")


# --- bad input (issue 35): every problem a ClusterError naming the file, line and field ---------

@pytest.mark.parametrize("text,message", [
    ("", r"<cluster>: the field name is missing \(a string\)"),
    (GOOD.replace('name = "mine"\n', ""), r"the field name is missing \(a string\)"),
    (GOOD.replace('name = "X1"\n', ""), r"the field \[device\] name is missing \(a string\)"),
    (GOOD.replace("[device.peak_flops]", "[device.peak_flop]"),
     r"unknown field \[device\] peak_flop .*did you mean 'peak_flops'"),
    (GOOD.replace('bf16 = "100 TFLOP/s"\nf32 = 25e12\n', "").replace("[device.peak_flops]\n", ""),
     r"the field \[device\] peak_flops is missing \(a table of dtype = FLOP/s\)"),
    (GOOD.replace("nodes = 2", "nodes = " + "9" * 400),
     r"<cluster>:3: nodes: expected a count quantity, got an integer of 400 digits"),
    (GOOD.replace('memory = "24 GiB"', "memory = " + "9" * 400), r"<cluster>:8: \[device\] memory: .* 400 digits"),
    (GOOD + "\n[efficiency]\ngemm_knee = 1e308\n",
     r"\[efficiency\] gemm_knee = 1e\+308 is outside the range partita accepts for it, 0.001 to 1,000,000"),
    (GOOD.replace('bf16 = "100 TFLOP/s"', 'bf16 = "5e-324 TFLOP/s"'),
     r"<cluster>:12: \[device.peak_flops\] bf16 = '5e-324 TFLOP/s' is outside the range"),
    (GOOD + "\n[efficiency]\nop_overhead = 1e308\n", r"\[efficiency\] op_overhead = 1e\+308 is outside the range"),
    (GOOD.replace('memory = "24 GiB"', 'memory = "1e-300 B"'), r"\[device\] memory = '1e-300 B' is outside"),
    (GOOD.replace('memory = "24 GiB"', 'memory = "1e400 GiB"'), r"beyond any finite bytes quantity"),
    (GOOD.replace("nodes = 2", "nodes = 1000000\ncores_per_node = 2").replace("gpus_per_node = 4", "gpus_per_node = 4000"),
     r"more than the 100,000,000 devices"),
    ("sources = " + "[" * 5000 + "]" * 5000, r"nested too deeply"),
])
def test_bad_values_are_located_cluster_errors(text, message):
    with pytest.raises(ClusterError, match=message):
        parse_cluster(text)


MEASURED = '\n[intra_node.measured]\nall_reduce = {{ ranks = {ranks}, bytes = {bytes}, seconds = {seconds} }}\n'


@pytest.mark.parametrize("ranks,nbytes,seconds,message", [
    (4, '["abc"]', "[1e-4]", r"bytes\[0\] = 'abc' is not a number"),
    (4, "[[1]]", "[1e-4]", r"bytes\[0\] = \[1\] is not a number"),
    (4, "[4]", '["x"]', r"seconds\[0\] = 'x' is not a number"),
    (4, "[true]", "[1e-4]", r"bytes\[0\] = True is not a number"),
    (4, "[" + "9" * 400 + "]", "[1e-4]", r"bytes\[0\] = 9+.* is not a number"),
    (4, "[4, 8]", "[1e-4]", r"2 bytes but 1 seconds"),
    (4, "[8, 4]", "[1e-4, 2e-4]", r"the bytes do not increase"),
    (1, "[4]", "[1e-4]", r"ranks = 1 is not a whole number from 2"),
    ("true", "[4]", "[1e-4]", r"ranks = True is not a whole number"),
    (4, "[]", "[]", r"bytes = \[\] is not a non-empty list"),
])
def test_bad_measured_entries_are_located(ranks, nbytes, seconds, message):
    text = GOOD + MEASURED.format(ranks=ranks, bytes=nbytes, seconds=seconds)
    with pytest.raises(ClusterError, match=r"<cluster>:\d+: all_reduce in \[intra_node.measured\]: " + message):
        parse_cluster(text)


def test_bad_files_and_arguments_are_cluster_errors(tmp_path):
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(GOOD.replace("X1", "X\xe9").encode("latin-1"))
    with pytest.raises(ClusterError, match=rf"{bad}:7: the cluster file is not UTF-8 text \(byte \d+ is 0xe9\)"):
        load_cluster(bad)
    with pytest.raises(ClusterError, match=r"/dev/null: the field name is missing"):
        load_cluster("/dev/null")
    with pytest.raises(ClusterError, match=r"holds a NUL byte"):
        load_cluster("sel\0ene.toml")
    with pytest.raises(ClusterError, match=r"is a directory"):
        load_cluster(tmp_path)
    for junk in (123, None, 1.5, ["selene"]):
        with pytest.raises(ClusterError, match=r"load_cluster: give a shipped cluster's name .* got"):
            load_cluster(junk)
    for junk in (None, 12, ["x"]):
        with pytest.raises(ClusterError, match=r"parse_cluster: text must be the TOML text"):
            parse_cluster(junk)
    assert parse_cluster(GOOD.encode()).name == "mine"
    c = parse_cluster(GOOD)
    for junk in ("2", 1.5, None, True):
        with pytest.raises(ClusterError, match=r"with_nodes: nodes must be a whole number"):
            c.with_nodes(junk)
    with pytest.raises(ClusterError, match=r"takes 1 to 1,000,000 nodes of 4 devices, got 10,000,000"):
        c.with_nodes(10 ** 7)
    assert c.with_nodes(3).devices == 12
    with pytest.raises(ClusterError, match=r"parse_quantity: kind must be one of bytes"):
        parse_quantity("1 GB", "weird")
    with pytest.raises(ValueError, match=r"got \[1\] \(list\)"):
        parse_quantity([1], "bytes")


@pytest.mark.parametrize("field", ["gemm", "attention", "memory", "network"])
def test_an_efficiency_too_small_for_any_machine_is_refused(field):
    # 5e-324 was accepted as a fraction in (0, 1], then the cost model divided by zero or
    # simulated an infinite step.
    with pytest.raises(ClusterError, match=rf"\[efficiency\] {field} = 5e-324 is outside the range .* 0.001 to 1"):
        parse_cluster(GOOD + f"\n[efficiency]\n{field} = 5e-324\n")
