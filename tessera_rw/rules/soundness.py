"""The rule soundness checker: every rewrite a rule makes must compute what it replaced.

For a rule, build its example program on random data, saturate with that rule alone, and evaluate
the original and every one-e-node variation of the smallest term on the numpy reference executor.
A disagreement beyond the dtype's tolerance is a counterexample.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np

from tessera_rw.algebra.dtypes import DType
from tessera_rw.algebra.evaluate import evaluate
from tessera_rw.algebra.errors import TesseraError
from tessera_rw.algebra.graph import Graph
from tessera_rw.algebra.node import TensorType
from tessera_rw.algebra.trace import trace
from tessera_rw.rules.choice import smallest_choice, variants
from tessera_rw.rules.egraph import CycleError
from tessera_rw.rules.rule import Rule, Ruleset
from tessera_rw.rules.saturate import Limits, rewrite

INSTANCES = 5        # random instances of its example a rule is checked on, by `rules --check` and plugin vetting

# Agreement bounds by output dtype, relative to the result's scale (`_scales`).
TOLERANCE = {DType.float64: 1e-10, DType.float32: 2e-5, DType.float16: 4e-3, DType.bfloat16: 3e-2,
             DType.float8_e4m3: 0.25, DType.float8_e5m2: 0.5}


class Verdict(enum.Enum):
    OK = "ok"
    UNSOUND = "unsound"              # a rewritten program computes something else
    UNCHECKED = "unchecked"          # no example, a failing one, or one the rule does not match


@dataclass(frozen=True)
class RuleCheck:
    rule: str
    ruleset: str
    ok: bool
    variants: int = 0
    detail: str = ""
    unchecked: bool = False          # not ok because it could not be checked (no example, or a broken one)

    @property
    def verdict(self) -> Verdict:
        return Verdict.OK if self.ok else Verdict.UNCHECKED if self.unchecked else Verdict.UNSOUND


def example_graph(rule: Rule, rng: np.random.Generator) -> tuple[Graph, dict[str, np.ndarray]]:
    fn, inputs = rule.example(rng)
    types = {n: TensorType(a.shape, DType.parse(a.dtype)) for n, a in inputs.items()}
    return trace(fn, types, {}, name=rule.name).graph, inputs


# Relative size of the input perturbations that measure how far rounding can move a result, how
# many random ones each input gets (beside two fixed ones), and the smaller nudge that tells a
# smooth change from a jump.
NUDGE = 2.0 ** -20
NUDGES = 2
FINER = 8


def _scales(graph: Graph, inputs: dict[str, np.ndarray]) -> list[float]:
    """Per output, the magnitude that rounding error is relative to.

    That is the largest expected value, or more where the result cancels: a sum of terms that nearly
    cancel rounds relative to its terms, not to its small total. The terms' size shows as the
    result's sensitivity to nudging the elements of one input at a time by a relative NUDGE up or
    down (`_sign_patterns`), measured in float64. Only a change that shrinks FINER-fold with a FINER-fold
    smaller nudge counts: a jump (a comparison, a tie of a max flipping) says nothing of rounding
    and must not widen the bound."""
    try:
        exact = evaluate(graph, inputs, precise=True)
        rng = np.random.default_rng(0)
        sensitivity = [0.0] * len(exact)
        # every float input, 16- and 8-bit ones too (ml_dtypes' kind is "V"), nudged wide: in its own
        # type a nudge this small would round back to the value
        for name in (n for n, a in inputs.items() if DType.parse(np.asarray(a).dtype).is_float
                     or DType.parse(np.asarray(a).dtype).is_complex):
            wide = np.asarray(inputs[name], np.complex128 if np.iscomplexobj(inputs[name]) else np.float64)
            for signs in _sign_patterns(np.shape(inputs[name]), rng):
                coarse, fine = (evaluate(graph, inputs | {name: wide * (1 + size * signs)}, precise=True)
                                for size in (NUDGE, NUDGE / FINER))
                for i, (e, c, f) in enumerate(zip(exact, coarse, fine)):
                    sensitivity[i] = max(sensitivity[i], _smooth_change(e, c, f) / NUDGE)
    except Exception:             # noqa: BLE001  an op with no float64 reference: scale by the result
        return [_largest(np.asarray(e, np.float64)) for e in evaluate(graph, inputs)]
    return [max(_largest(e), s) for e, s in zip(exact, sensitivity)]


def _sign_patterns(shape: tuple[int, ...], rng: np.random.Generator) -> list[np.ndarray]:
    """±1 arrays of `shape` to nudge an input by: alternating, first half against second half (in
    flat order), then NUDGES random ones. A sum that cancels changes under most of them."""
    flat = np.arange(int(np.prod(shape)))
    fixed = [1.0 - 2.0 * (flat % 2), np.where(flat < (len(flat) + 1) // 2, 1.0, -1.0)]
    return [p.reshape(shape) for p in fixed] + [rng.choice([-1.0, 1.0], size=shape) for _ in range(NUDGES)]


def _smooth_change(exact: np.ndarray, coarse: np.ndarray, fine: np.ndarray) -> float:
    """The largest change of a float result under the coarse nudge among the elements whose change
    scales with the nudge (the fine nudge's is about 1/FINER of it); 0 for other results."""
    if exact.dtype.kind not in "fc":
        return 0.0
    with np.errstate(invalid="ignore"):            # an infinite result (a masked score) stays put: inf − inf
        big, small = np.abs(coarse - exact), np.abs(fine - exact)
        smooth = np.isfinite(big) & (np.abs(big - FINER * small) <= 0.25 * big)
    return _largest(big[smooth])


def _largest(a: np.ndarray) -> float:
    finite = np.abs(a[np.isfinite(a)])
    return float(np.max(finite, initial=0.0))


def _disagreement(got: np.ndarray, want: np.ndarray, scale: float) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return float("inf")
    finite = np.isfinite(want)
    if not np.array_equal(finite, np.isfinite(got)) or not np.array_equal(want[~finite], got[~finite], equal_nan=True):
        return float("inf")
    return float(np.max(np.abs(got[finite] - want[finite]), initial=0.0)) / max(scale, 1e-30)


def _rewritten_alone(rule: Rule, ruleset: Ruleset, graph: Graph):
    """`graph` saturated with `rule` alone (and the rules of its ruleset it `needs`)."""
    helpers = tuple(r for r in ruleset.rules if r.name in rule.needs and r is not rule)
    alone = Ruleset(ruleset.name, (rule, *helpers), facts=ruleset.facts, origin=ruleset.origin)
    return rewrite(graph, [alone], Limits(iterations=8, enodes=5_000, seconds=20))


def check_rule(rule: Rule, ruleset: Ruleset, rng: np.random.Generator) -> RuleCheck:
    """Check one rule on one random instance of its example."""
    if rule.example is None:
        return RuleCheck(rule.name, ruleset.name, False, detail="the rule has no example to check it on",
                         unchecked=True)
    try:
        graph, inputs = example_graph(rule, rng)
        expected = evaluate(graph, inputs)
    except Exception as e:       # the example's own fault: this rule is unchecked, the others go on
        return RuleCheck(rule.name, ruleset.name, False, detail=f"its example failed: {type(e).__name__}: "
                         f"{e}".replace("\n", " "), unchecked=True)
    result = _rewritten_alone(rule, ruleset, graph)
    if result.report.matches[f"{ruleset.name}/{rule.name}"] == 0:
        return RuleCheck(rule.name, ruleset.name, False, detail="the rule does not match its own example",
                         unchecked=True)
    view = result.view
    base = smallest_choice(view)
    roots = result.output_classes()
    # A rewrite may skip a rounding the original made (a cast absorbed into a gemm), so results
    # agree to the tolerance of the least precise type the original computes in.
    tolerance = max((TOLERANCE.get(n.dtype, 0.0) for n in graph.nodes), default=0.0)
    scales = _scales(graph, inputs)
    checked = rewritten = 0
    for enode, choice in [(None, base), *variants(view, base)]:
        try:
            outputs = view.decode_all(choice, roots)
        except CycleError:
            continue
        except TesseraError as e:     # a rewritten term its op's shape rule refuses: the rule mistyped it
            what = f"choosing a {enode.op} node" if enode else "the smallest rewritten term"
            return RuleCheck(rule.name, ruleset.name, False, checked,
                             f"{what} builds a term its op refuses ({e.op or 'op'}: {e.detail}); give the "
                             "right-hand side's terms the types the left-hand side's have")
        try:
            got = evaluate(Graph(graph.name, graph.inputs, outputs), inputs)
        except Exception as e:        # noqa: BLE001  a mistyped term numpy cannot evaluate
            return RuleCheck(rule.name, ruleset.name, False, checked,
                             f"evaluating the rewritten program raised {type(e).__name__}: {e}")
        for g, w, scale in zip(got, expected, scales):
            err = _disagreement(g, w, scale)
            if err > tolerance:
                shapes = ", ".join(f"{n}: {TensorType(a.shape, DType.parse(a.dtype))}" for n, a in inputs.items())
                what = f"choosing a {enode.op} node" if enode else "the smallest rewritten term"
                return RuleCheck(rule.name, ruleset.name, False, checked,
                                 f"{what} changes the result by {err:.3g} (relative) "
                                 f"on inputs {shapes}:\n{Graph(graph.name, graph.inputs, outputs)}")
        checked += 1
        rewritten += outputs != graph.outputs     # nodes are interned: equal programs are the same nodes
    if not rewritten:
        return RuleCheck(rule.name, ruleset.name, False, checked,
                         "no choice in the e-graph but the original program could be built and evaluated, so "
                         "the rule's right-hand side went unchecked", unchecked=True)
    return RuleCheck(rule.name, ruleset.name, True, checked)


def op_instances(rule: Rule, ruleset: Ruleset, names: frozenset[str],
                 rng: np.random.Generator) -> list[tuple[str, tuple[TensorType, ...], dict]]:
    """(op, operand types, attributes) of each e-node of an op in `names` that the rule's example
    rewrites to: where a plugin's ops get the shapes their VJP is checked at."""
    if rule.example is None:
        return []
    try:
        graph, _ = example_graph(rule, rng)
    except Exception:             # noqa: BLE001  the rule check reports a broken example
        return []
    view = _rewritten_alone(rule, ruleset, graph).view
    return [(n.op, tuple(view.types[c] for c in n.operands), dict(n.attrs))
            for ns in view.classes.values() for n in ns if n.op in names]
