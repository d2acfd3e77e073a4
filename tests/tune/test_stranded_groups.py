"""Extraction moves a program off one packed node onto another even when no switch and no group of
switches pays alone: the group that moves two readers strands the old node with a third reader,
and only re-choosing that reader (the repair) frees it."""

import math

from tessera_rw.tune.chosen_program import ChosenProgram
from tessera_rw.tune.dag_sharing import VIEW_COST, share_more
from tests.hand_built_egraphs import enode, view_of

# P and Q pack what dx, dW and db read (norm_backward_grads and norm_backward_stats, say); dW read
# from Q's two views is priced twice by tree costs, so extraction starts on P
COST = {"input": 0.0, "pack_p": 3.0, "pack_q": 2.5, "view": VIEW_COST, "sum_p": 2.5, "sum_p2": 2.0,
        "from_q": 2.0, "sum_x": 2.5}


def _egraph():
    x, p, q = enode("x", "input"), enode("p", "pack_p", "x"), enode("q", "pack_q", "x")
    return view_of(x, p, q, enode("dx", "view", "p"), enode("dx", "view", "q"),
                   enode("m", "view", "q"), enode("v", "view", "q"),
                   enode("dw", "sum_p", "p"), enode("dw", "from_q", "x", "m", "v"),
                   enode("db", "sum_p2", "p"), enode("db", "sum_x", "x"))


def _cost(choice, roots=("dx", "dw", "db")):
    return sum(COST[choice[c].op] for c in ChosenProgram(dict(choice), roots).post)


def test_a_group_that_strands_a_packed_node_is_repaired_by_moving_its_last_reader():
    view = _egraph()

    def pick(cid, op, *operands):
        return next(e for e in view.classes[cid] if e.op == op and (not operands or e.operands == operands))
    # where the single and paired switches leave it: everything on P
    stuck = {"x": pick("x", "input"), "p": pick("p", "pack_p"), "q": pick("q", "pack_q"), "m": pick("m", "view"),
             "v": pick("v", "view"), "dx": pick("dx", "view", "p"), "dw": pick("dw", "sum_p"),
             "db": pick("db", "sum_p2")}
    assert math.isclose(_cost(stuck), 7.5, rel_tol=1e-6)        # P, dW's sum and db's sum over P
    chosen = share_more(view, stuck, ("dx", "dw", "db"), lambda e: COST[e.op])
    # dx and dW alone onto Q cost 2.0 more while db keeps P; db onto x then frees P: 7.0 in all
    assert (chosen["dx"].operands, chosen["dw"].op, chosen["db"].op) == (("q",), "from_q", "sum_x")
    assert math.isclose(_cost(chosen), 7.0, rel_tol=1e-6)
