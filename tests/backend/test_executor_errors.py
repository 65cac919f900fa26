"""What the executors say about bad values, bad containers and failing nodes.

Both executors take the same inputs and must reject the same junk with the same
ExecutionError, naming the input or weight and what is accepted; a node whose
implementation fails at run time is named by its results, op and places.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partita
from partita.backend.common import node_error
from partita.ir.diagnostics import ExecutionError, PartitaError

BACKENDS = ("numpy", "torch")

EMBED = """graph @g(%t: f32[4,3] param, %i: i64[2]) -> (f32[2,3]) {
  %e = embedding(%t, %i) : f32[2,3] loc("model.py":7)
  return %e
}"""

# The shapes disagree, which only running finds: the graph is not verified.
MATMUL = """graph @g(%x: f32[4,3], %w: f32[2,5]) -> (f32[4,5]) {
  %y = matmul(%x, %w) : f32[4,5] loc("model.py":3)
  return %y
}"""


def embed_graph():
    g = partita.parse(EMBED, "m.pir")
    g.weights["t"] = np.arange(12, dtype=np.float32).reshape(4, 3)
    return g


def error_of(fn) -> ExecutionError:
    with pytest.raises(ExecutionError) as ei:
        fn()
    return ei.value


JUNK = [(None, "got None"), ("abc", "got a str"), ({"a": 1}, "got a dict"), ({1, 2}, "got a set"),
        (np.array([object(), object()], dtype=object), "got a NumPy array of Python objects (dtype object"),
        (np.array(["x", "y"]), "got a NumPy array of strings"),
        ([[1.0, 2.0], [3.0]], "got a list that is no array")]


@pytest.mark.parametrize("value,said", JUNK, ids=[type(j).__name__ + str(i) for i, (j, _) in enumerate(JUNK)])
def test_junk_input_is_named_the_same_on_both_executors(value, said):
    g = embed_graph()
    msgs = [str(error_of(lambda: partita.run(g, {"i": value}, backend=b))) for b in BACKENDS]
    assert msgs[0] == msgs[1]
    assert msgs[0].startswith("input %i (input) expects i64[2] as a NumPy array or a torch tensor")
    assert said in msgs[0]


@pytest.mark.parametrize("value,said", JUNK[:4], ids=["none", "str", "dict", "set"])
def test_junk_weight_is_named_the_same_on_both_executors(value, said):
    g = embed_graph()
    i = np.array([0, 1])
    msgs = [str(error_of(lambda: partita.run(g, [i], {"t": value}, backend=b))) for b in BACKENDS]
    assert msgs[0] == msgs[1]
    assert msgs[0].startswith("input %t (param) expects f32[4,3] as a NumPy array") and said in msgs[0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_wrong_containers_say_what_is_accepted(backend):
    g = embed_graph()
    i = np.array([0, 1])
    msg = str(error_of(lambda: partita.run(g, {0: i}, backend=backend)))
    assert "@g: inputs given as a dict need the inputs' names as keys (t, i), got the key 0 (int)" in msg
    assert "pass a list" in msg
    msg = str(error_of(lambda: partita.run(g, {0: i, "x": i}, backend=backend)))
    assert "got the key 0 (int)" in msg
    accepted = ("@g: inputs must be a list or tuple of arrays in the order of the graph's inputs, a dict "
                "from input name to array, or None; got ")
    for inputs, said in (("ab", "a str"), (5, "an int"), ({0, 1}, "a set"), (b"xy", "a bytes"),
                         (i, "a NumPy array (dtype int64, shape [2]) (for one input x, pass [x])")):
        assert str(error_of(lambda: partita.run(g, inputs, backend=backend))) == accepted + said
    msg = str(error_of(lambda: partita.run(g, [i], [np.zeros((4, 3), np.float32)], backend=backend)))
    assert msg.startswith("@g: weights must be a mapping from param/state name to array (a dict or "
                          "partita.Weights), got a list")
    # What is accepted still works: a tuple, a generator, a dict, and weights as a dict.
    want = g.weights["t"][[0, 1]]
    for inputs in ((i,), (x for x in [i]), {"i": i}):
        out = partita.run(g, inputs, {"t": g.weights["t"]}, backend=backend)[0]
        np.testing.assert_array_equal(np.asarray(out), want)


def test_run_needs_a_graph():
    with pytest.raises(PartitaError, match=r"partita.run: the graph must be a partita.Graph .*got str"):
        partita.run("model.pir", [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_index_out_of_range_names_the_node(backend):
    g = embed_graph()
    msg = str(error_of(lambda: partita.run(g, [np.array([1, 9])], backend=backend)))
    assert msg.startswith("%e = embedding at m.pir:2:8 (from model.py:7): "), msg
    if backend == "numpy":
        assert "index 9 is out of range for a table of 4 rows" in msg


@pytest.mark.parametrize("backend", BACKENDS)
def test_shape_error_at_run_time_names_the_node(backend):
    g = partita.parse(MATMUL, "m.pir")
    x, w = np.zeros((4, 3), np.float32), np.zeros((2, 5), np.float32)
    msg = str(error_of(lambda: partita.run(g, [x, w], backend=backend)))
    assert msg.startswith(f"%y = matmul at m.pir:2:8 (from model.py:3): the {backend if backend == 'torch' else 'reference'}"
                          " implementation failed: "), msg


def test_node_error_keeps_errors_with_fields_as_they_are():
    node = next(iter(embed_graph().nodes))

    class WithFields(ExecutionError):
        def __init__(self, message: str, rank: int) -> None:
            super().__init__(message)
            self.rank = rank

    e = WithFields("the peer died", rank=3)
    assert node_error(node, e, "torch implementation") is e
    plain = node_error(node, ExecutionError("embedding: bad"), "reference implementation")
    assert type(plain) is ExecutionError and str(plain) == "%e = embedding at m.pir:2:8 (from model.py:7): embedding: bad"
    again = node_error(node, plain, "reference implementation")
    assert again is plain  # already named: not named twice


# --- a property: junk in, only PartitaError out --------------------------------------------------

SMALL = """graph @s(%a: f32[2,3], %k: i64[3], %m: bool[2,3], %w: f32[3] param) -> (f32[2,3]) {
  %0 = mul(%a, %w) : f32[2,3]
  %1 = where(%m, %0, %a) : f32[2,3]
  return %1
}"""


def _arrays():
    shapes = st.sampled_from([(), (3,), (2, 3), (3, 2), (0,), (2, 3, 1)])
    dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.int32, np.bool_, np.uint8, np.complex64,
                              np.float16, "U2", object])
    return st.builds(lambda s, d: np.zeros(s, dtype=d), shapes, dtypes)


scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=3),
                    st.binary(max_size=3), st.complex_numbers(allow_nan=True))
values = st.recursive(st.one_of(scalars, _arrays()),
                      lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                                              st.dictionaries(st.text(max_size=2), inner, max_size=2),
                                              st.frozensets(st.integers(), max_size=2)),
                      max_leaves=6)
names = st.sampled_from(["a", "k", "m", "w", "zz"])
keys = st.one_of(names, st.integers(-1, 3), st.none(), st.tuples(names))
containers = st.one_of(values,
                       st.dictionaries(keys, values, max_size=4),
                       st.dictionaries(names, st.one_of(values, _arrays()), max_size=4),
                       st.lists(st.one_of(values, _arrays()), max_size=4))
weights = st.one_of(st.none(), values, st.dictionaries(st.one_of(names, st.integers()), values, max_size=2))


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(inputs=containers, weights=weights, backend=st.sampled_from(BACKENDS))
def test_junk_raises_only_partita_errors(inputs, weights, backend):
    g = partita.parse(SMALL, "s.pir")
    g.weights["w"] = np.ones(3, np.float32)
    try:
        partita.run(g, inputs, weights, backend=backend)
    except PartitaError:
        pass
