"""Passes of a looped reduction that take one loop where the decomposed graph asks
for two: Welford's moments (a row sum and the squared deviations from its mean) and
the online softmax normalizer (a row max and the sum of exp(x - max)). Methods of
the Triton kernel builder (codegen/triton.py), which decides when they apply
(codegen/triton_patterns.py finds the pairs)."""

from __future__ import annotations

from typing import Sequence

from fuselens.compiler.codegen.triton_ops import TL_DTYPES
from fuselens.compiler.codegen.triton_patterns import deviation_center
from fuselens.compiler.ir import ComputeNode


class OneLoopPasses:
    # -- Welford moments ------------------------------------------------------
    def _welford_pass(self, groups: Sequence[Sequence[ComputeNode]]) -> list[tuple[str, str, str]]:
        """One loop of per-lane Welford updates over each group's A (its sums' common
        body) and a plain per-lane sum for the sums themselves. Finishes every sum and
        returns each group's per-lane (mean, M2, count) accumulators for `_finish_welford_q`."""
        accs = []
        for _ in groups:
            self.counter += 1
            c = self.counter
            accs.append((f"accwm{c}", f"accwq{c}", f"accwn{c}", f"accws{c}"))
        tdts = [TL_DTYPES[self.rep_dtype(sums[0].acc_dtype)] for sums in groups]
        for acc, tdt in zip(accs, tdts):
            for v in acc:
                self.line(f"{v} = tl.full([XBLOCK, RBLOCK], 0.0, {tdt})")
        self.evict = "evict_last"
        loop = self._open_loop()
        mask = self.mask_for({"x", "r"})
        for sums, (m, m2, n, t) in zip(groups, accs):
            s = sums[0]
            a, _ = self._red_input(s)
            n1 = self.emit(f"{n} + 1.0", s.acc_dtype)
            d = self.emit(f"{a} - {m}", s.acc_dtype)
            m1 = self.emit(f"{m} + {d} / {n1}", s.acc_dtype)
            q1 = f"{m2} + {d} * ({a} - {m1})"
            if mask is None:
                self.line(f"{m}, {m2}, {n}, {t} = {m1}, {q1}, {n1}, {t} + {a}")
            else:  # lanes past the row's end keep their state (count 0: they add nothing below)
                self.line(f"{m}, {m2}, {n}, {t} = tl.where({mask}, {m1}, {m}), tl.where({mask}, {q1}, {m2}), "
                          f"tl.where({mask}, {n1}, {n}), tl.where({mask}, {t} + {a}, {t})")
        self._close_loop(loop)
        self.evict = None
        for sums, (_, _, _, t) in zip(groups, accs):
            total = self.emit(f"tl.sum({t}, 1)[:, None]", sums[0].acc_dtype, self.top)
            for r in sums:
                self._finish_red(r, total.name, self.rep_dtype(sums[0].acc_dtype))
        return [(m, m2, n) for m, m2, n, _ in accs]

    def _finish_welford_q(self, s: ComputeNode, q: ComputeNode, m: str, m2: str, cnt: str) -> None:
        """sum((A - M)^2) over the row = sum over lanes of M2 + n (mean - M)^2 (the
        parallel-axis theorem) for the row constant M, the accurate mean S/n. Both
        sums are plain tree reductions: merging Welford partials with Chan's formula
        rounds the running mean at every merge (rows at mean 1000: 9e-4 off in the
        interpreter's sequential merge)."""
        center = self.top.values[deviation_center(self, s, q).name]
        rep = self.rep_dtype(q.acc_dtype)
        dev = f"({m} - {center.name}.to({TL_DTYPES[rep]}))"
        self._finish_red(q, f"tl.sum({m2} + {cnt} * {dev} * {dev}, 1)[:, None]", rep)

    # -- online softmax -------------------------------------------------------
    def _online_pass(self, mx: ComputeNode, sm: ComputeNode) -> None:
        """One loop computing the row max M and sum(exp(A - M)) with a running
        max m and a running sum rescaled by exp(m_old - m_new) (Milakov &
        Gimelshein's online normalizer)."""
        rep = self.rep_dtype(mx.acc_dtype)
        tdt = TL_DTYPES[rep]
        self.counter += 1
        m, s = f"accm{self.counter}", f"accs{self.counter}"
        self.line(f"{m} = tl.full([XBLOCK, RBLOCK], float(\"-inf\"), {tdt})")
        self.line(f"{s} = tl.full([XBLOCK, RBLOCK], 0.0, {tdt})")
        loop = self._open_loop()
        a, _ = self._red_input(mx)
        am = self.emit(self._masked(a, 'float("-inf")'), mx.acc_dtype)
        mn = self.emit(f"_fl_maximum({m}, {am})", mx.acc_dtype)
        # exp(-inf - -inf) is NaN: a lane that has seen only -inf keeps sum 0
        self.line(f"{s} = tl.where({mn} == float(\"-inf\"), 0.0, {s} * tl.exp({m} - {mn}) + tl.exp({am} - {mn}))")
        self.line(f"{m} = {mn}")
        self._close_loop(loop)
        self._finish_red(mx, f"tl.reduce({m}, 1, _fl_maximum)[:, None]", rep)
        mrow = self.top.values[mx.name]
        tot = f"tl.sum(tl.where({m} == float(\"-inf\"), 0.0, {s} * tl.exp({m} - {mrow})), 1)[:, None]"
        self._finish_red(sm, tot, rep)

