"""The report's "Silence proof" section: numbers, paired comparisons and verdicts of a proof file.

Targets (fixed before the run, from the silence issue):

* (P1) trained Agent-GSPO on held-out items: the agents WITHOUT the fact are silent in >= 80 % of
  their turns, the agent WITH it in <= 10 %;
* (P2) team accuracy >= 0.90 and >= 0.20 above the untrained MAS (paired: the same items, the
  difference's standard error from the per-item differences);
* (P3) total tokens (prompt + completion) per episode <= 0.5 x the untrained MAS's;
* (P4) the dual controller holds mean completion tokens per episode within ±10 % of B (two-sided)
  over the last >= 64 training episodes;
* (P5) λ = 0 on the same task is reported, whatever it shows (no verdict).

A verdict is INCONCLUSIVE instead of PASS/FAIL when the run it judges never updated the policy
(every advantage group had zero spread), since then nothing was learned that could be judged.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from components.experiments import plots
from components.experiments.claims import Claim
from components.experiments.proof import ProofResults

SILENT_UNINFORMED, SPEAKING_INFORMED = 0.80, 0.10
ACCURACY, MARGIN, TOKEN_SHARE, BAND, WINDOW = 0.90, 0.20, 0.50, 0.10, 64
LABELS = {"mas_untrained": "untrained MAS", "mas_prior": "prior only (no RL)", "agent_gspo": "Agent-GSPO (budget)",
          "lambda0": "λ=0 (task reward only)"}


def paired(a: list[bool], b: list[bool]) -> tuple[float, float]:
    """Mean of a − b over the same items and the standard error of that mean (per-item differences)."""
    d = [float(x) - float(y) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(d) if d else 0.0
    se = statistics.stdev(d) / math.sqrt(len(d)) if len(d) > 1 else 0.0
    return mean, se


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def _updated(history: list[dict[str, float]]) -> bool:
    return any(h.get("train/zero_adv_groups", 0.0) < h.get("train/adv_groups", 0.0) for h in history)


def last_episodes(history: list[dict[str, float]], key: str, window: int = WINDOW) -> tuple[float, int]:
    """Mean of ``key`` over the last steps holding >= ``window`` episodes (episode-weighted), and that count."""
    total = weight = 0.0
    for h in reversed(history):
        n = h.get("train/episodes", 0.0)
        total += h.get(key, 0.0) * n
        weight += n
        if weight >= window:
            break
    return (total / weight if weight else float("nan")), int(weight)


def proof_claims(res: ProofResults) -> list[Claim]:
    """(P1)-(P5) of the module docstring."""
    cell = {s: next(iter(c.values())) for s, c in res.eval.items()}
    run = res.runs["agent_gspo"]
    moved = _updated(run.history)
    out = []
    trained, untrained = cell["agent_gspo"], cell["mas_untrained"]
    s_un, s_in = trained.silence_uninformed, trained.silence_informed
    ok = s_un is not None and s_in is not None and s_un >= SILENT_UNINFORMED and s_in <= SPEAKING_INFORMED
    out.append(Claim("P1", f"strategic silence: uninformed agents silent >= {SILENT_UNINFORMED:.0%}, the informed "
                     f"agent <= {SPEAKING_INFORMED:.0%} of turns", _status(ok, moved), [
                         f"held-out silence of Agent-GSPO: uninformed {_pct(s_un)}, informed {_pct(s_in)}",
                         f"untrained MAS: uninformed {_pct(untrained.silence_uninformed)}, informed "
                         f"{_pct(untrained.silence_informed)}; prior only: uninformed "
                         f"{_pct(cell['mas_prior'].silence_uninformed)}, informed "
                         f"{_pct(cell['mas_prior'].silence_informed)}"]))
    diff, se = paired(res.correct["agent_gspo"], res.correct["mas_untrained"])
    ok = trained.accuracy >= ACCURACY and diff >= MARGIN
    out.append(Claim("P2", f"team accuracy >= {ACCURACY:.2f} and >= {MARGIN:.2f} above the untrained MAS",
                     _status(ok, moved), [
                         f"accuracy {trained.accuracy:.3f} vs untrained {untrained.accuracy:.3f} on the same "
                         f"{trained.n} items: paired difference {diff:+.3f} ± {se:.3f} "
                         "(SE of the per-item differences)",
                         f"prior only {cell['mas_prior'].accuracy:.3f}; λ=0 {cell['lambda0'].accuracy:.3f}"]))
    ratio = trained.tokens_total_mean / untrained.tokens_total_mean if untrained.tokens_total_mean else float("nan")
    out.append(Claim("P3", f"total tokens per episode <= {TOKEN_SHARE:.1f}x the untrained MAS", _status(
        ratio <= TOKEN_SHARE, moved), [
        f"{trained.tokens_total_mean:.1f} vs {untrained.tokens_total_mean:.1f} tokens per episode: {ratio:.2f}x "
        f"(prompt {trained.tokens_prompt_mean:.1f} + completion {trained.tokens_completion_mean:.1f}; "
        f"calls skipped per episode {trained.calls_skipped:.2f} vs {untrained.calls_skipped:.2f})"]))
    cal = run.budget_calibration or {}
    target = float(cal.get("target", float("nan")))
    fraction, untrained_mean = float(cal.get("fraction", float("nan"))), float(cal.get("untrained_mean", 0))
    got, n = last_episodes(run.history, "train/budget_tokens")
    err = (got - target) / target if target == target and target else float("nan")
    ok = n >= WINDOW and abs(err) <= BAND
    out.append(Claim("P4", f"mean completion tokens per episode within ±{BAND:.0%} of B over the last >= {WINDOW} "
                     "training episodes (two-sided)", _status(ok, moved), [
                         f"B = {fraction:g} x {untrained_mean:.1f} "
                         f"(the untrained policy's sampled completion tokens per training episode, "
                         f"{int(float(cal.get('episodes', 0)))} episodes before step 1) = {target:.1f}",
                         f"last {n} training episodes: {got:.1f} tokens ({err:+.1%} from B)"]))
    lam0 = cell["lambda0"]
    out.append(Claim("P5", "λ = 0 on the same task (reported, no verdict)", "PASS" if res.runs.get("lambda0") else
                     "NOT RUN", [
                         f"accuracy {lam0.accuracy:.3f}, {lam0.tokens_total_mean:.1f} total / "
                         f"{lam0.tokens_completion_mean:.1f} completion tokens per episode; silence uninformed "
                         f"{_pct(lam0.silence_uninformed)}, informed {_pct(lam0.silence_informed)}; "
                         f"{lam0.tokens_total_mean / trained.tokens_total_mean:.2f}x Agent-GSPO's total tokens"]))
    return out


def _status(ok: bool, moved: bool) -> str:
    return "INCONCLUSIVE" if not moved else ("PASS" if ok else "FAIL")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def proof_section(res: ProofResults, fig_dir: Path, rel: str) -> tuple[list[str], list[Claim], dict[str, Path]]:
    """Markdown lines, verdicts and figures of one proof file."""
    claims = proof_claims(res)
    md = [f"## Silence proof ({res.name}): split information on the real model", "", res.description, ""]
    md += [f"Profile `{res.profile}` ({res.model}); held-out items: {res.limit or 'all'} of "
           f"{', '.join(res.benchmarks)}, disjoint from the training split; commit {res.git_commit or 'unknown'}; "
           f"{res.wall_seconds / 60:.0f} min in all (training {res.runs['agent_gspo'].train_seconds / 60:.0f} and "
           f"{res.runs['lambda0'].train_seconds / 60:.0f} min).", ""]
    md += ["| system | accuracy ± SE | total tokens / episode | completion | silence: uninformed | informed | "
           "turns | calls skipped |", "|---|---|---|---|---|---|---|---|"]
    for system in ("mas_untrained", "mas_prior", "agent_gspo", "lambda0"):
        c = next(iter(res.eval[system].values()))
        md.append(f"| {LABELS[system]} | {c.accuracy:.3f} ± {c.accuracy_se:.3f} | {c.tokens_total_mean:.1f} | "
                  f"{c.tokens_completion_mean:.1f} | {_pct(c.silence_uninformed)} | {_pct(c.silence_informed)} | "
                  f"{c.turns:.2f} | {c.calls_skipped:.2f} |")
    md += ["", "Recipe: " + ", ".join(f"`{k}={v}`" for k, v in res.recipe.items()), ""]
    for c in claims:
        md += [f"### ({c.key}) {c.title}: **{c.status}**", ""] + [f"- {line}" for line in c.evidence] + [""]
    histories = {LABELS[n]: r.history for n, r in res.runs.items()}
    budgets = {LABELS["agent_gspo"]: float(res.runs["agent_gspo"].budget_calibration["target"])} \
        if res.runs["agent_gspo"].budget_calibration else {}
    paths = {
        "proof_silence": plots.plot_role_silence(histories, fig_dir / "proof_silence.png"),
        "proof_tokens": plots.plot_curves(histories, "train/budget_tokens", fig_dir / "proof_tokens.png",
                                          ylabel="completion tokens / episode", budgets=budgets,
                                          title="Split information: tokens per training episode against B"),
        "proof_accuracy": plots.plot_curves(histories, "train/accuracy", fig_dir / "proof_accuracy.png",
                                            ylabel="team accuracy", title="Split information: training accuracy"),
    }
    md += [f"![silence per role over training]({rel}/proof_silence.png)", "",
           f"![tokens against B]({rel}/proof_tokens.png)", "", f"![training accuracy]({rel}/proof_accuracy.png)", ""]
    return md, claims, paths
