"""Many classes wanting one new class (a causal mask every layer could read): the pairs tried are
those of the few whose switch alone costs least, and all of them at once is still tried."""

from tessera_rw.tune import dag_sharing
from tessera_rw.tune.chosen_program import ChosenProgram
from tessera_rw.tune.dag_sharing import share_more
from tests.hand_built_egraphs import enode, view_of

READERS = 30
COST = {"input": 0.0, "mask": 3.0, "shared": 0.5}


def _choose(alone_cost: dict[int, float]) -> dict[str, str]:
    """Each reader r<i> computed alone (at alone_cost[i], 0.4 by default) or read from the mask, as
    extraction's DAG pass re-chooses them: reader -> the op it ends on."""
    x, mask = enode("x", "input"), enode("s", "mask", "x")
    readers = [f"r{i}" for i in range(READERS)]
    view = view_of(x, mask, *(e for r in readers for e in (enode(r, f"alone{r}", "x"), enode(r, "shared", "s"))))
    costs = COST | {f"alone{r}": alone_cost.get(i, 0.4) for i, r in enumerate(readers)}
    start = {"x": x, "s": mask} | {r: view.classes[r][0] for r in readers}
    chosen = share_more(view, start, readers, lambda e: costs[e.op])
    return {r: chosen[r].op for r in ChosenProgram(chosen, readers).post if r.startswith("r")}


def test_the_pair_that_pays_is_found_among_many_readers():
    assert READERS > dag_sharing.PAIRED_USERS
    # r7 and r23 each cost 3 alone: one read from the mask costs 0.5 more, the two together 2 less
    chosen = _choose({7: 3.0, 23: 3.0})
    assert {r for r, op in chosen.items() if op == "shared"} == {"r7", "r23"}


def test_every_reader_moves_at_once_where_only_all_of_them_pay():
    # each alone 1.0: a pair saves nothing (2 × 0.5 + 3 = 4 > 2), all thirty save 12
    chosen = _choose({i: 1.0 for i in range(READERS)})
    assert set(chosen.values()) == {"shared"}
