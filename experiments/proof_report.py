"""The report's "Silence proof" section: numbers, paired comparisons and verdicts of a proof file.

Targets (fixed before the run, from the silence issue; the values are those of rule version v1,
:mod:`experiments.rules`, which every call takes):

* (P1) trained Agent-GSPO on held-out items: the agents WITHOUT the fact are silent in >= 80 % of
  their turns, the agent WITH it in <= 10 %;
* (P2) team accuracy >= 0.90 and >= 0.20 above the untrained MAS (paired: the same items, the
  difference's standard error from the per-item differences);
* (P3) total tokens (prompt + completion) per episode <= 0.5 x the untrained MAS's;
* (P4) the dual controller holds mean completion tokens per episode within ±10 % of B (two-sided)
  over the last >= 64 training episodes; inside the band but with λ_tok clipped or still sweeping
  over those steps is INCONCLUSIVE (:func:`experiments.stats.controller_settled`);
* (P5) λ = 0 on the same task is reported, whatever it shows (REPORTED: no verdict).

A PASS needs a run that moved away from its base policy (KL from the base >= 1e-3, or held-out
tokens per item changed beyond 2 paired standard errors: :func:`experiments.stats.movement`);
a target missed by a run that did not move is still a FAIL (the target was not reached).
"""

from __future__ import annotations

from pathlib import Path

from components.machine import describe
from experiments import plots
from experiments.claims import Claim
from experiments.proof import ProofResults
from experiments.rules import VerdictRules
from experiments.stats import (
    ItemColumns,
    Movement,
    controller_settled,
    last_episodes,
    movement,
    paired,
    rule_at_endings,
    window_standard_error,
)

LABELS = {"mas_untrained": "untrained MAS", "mas_prior": "prior only (no RL)", "agent_gspo": "Agent-GSPO (budget)",
          "lambda0": "λ=0 (task reward only)"}


def _movement(res: ProofResults, run: str, rules: VerdictRules) -> Movement:
    """stats.movement on the proof's per-item total tokens against the untrained MAS."""
    cols = {name: {"all": ItemColumns(correct=res.correct[name], tokens_total=res.tokens[name],
                                      tokens_completion=res.tokens[name])} for name in (run, "mas_untrained")}
    return movement(res.runs[run].history, cols[run], cols["mas_untrained"], rules, tokens="tokens_total")


def _lambda0_movement(res: ProofResults, rules: VerdictRules) -> Movement | None:
    return _movement(res, "lambda0", rules) if "lambda0" in res.runs and "lambda0" in res.correct else None


def proof_claims(res: ProofResults, rules: VerdictRules) -> list[Claim]:
    """(P1)-(P5) of the module docstring, under ``rules``."""
    r = rules
    cell = {s: next(iter(c.values())) for s, c in res.eval.items()}
    run = res.runs["agent_gspo"]
    move = _movement(res, "agent_gspo", rules)
    moved = move.moved
    out = []
    trained, untrained = cell["agent_gspo"], cell["mas_untrained"]
    s_un, s_in = trained.silence_uninformed, trained.silence_informed
    quiet, speaking = r.proof_silent_uninformed, r.proof_speaking_informed
    ok = s_un is not None and s_in is not None and s_un >= quiet and s_in <= speaking
    out.append(Claim("P1", f"strategic silence: uninformed agents silent >= {quiet:.0%}, the informed "
                     f"agent <= {speaking:.0%} of turns", _status(ok, moved), [
                         f"held-out silence of Agent-GSPO: uninformed {_pct(s_un)}, informed {_pct(s_in)}",
                         f"untrained MAS: uninformed {_pct(untrained.silence_uninformed)}, informed "
                         f"{_pct(untrained.silence_informed)}; prior only: uninformed "
                         f"{_pct(cell['mas_prior'].silence_uninformed)}, informed "
                         f"{_pct(cell['mas_prior'].silence_informed)}",
                         f"Agent-GSPO {'moved' if moved else 'did not move'} from its base policy: {move.why}"]))
    diff, se = paired(res.correct["agent_gspo"], res.correct["mas_untrained"])
    ok = trained.accuracy >= r.proof_accuracy and diff >= r.proof_margin
    out.append(Claim("P2", f"team accuracy >= {r.proof_accuracy:.2f} and >= {r.proof_margin:.2f} above the "
                     "untrained MAS",
                     _status(ok, moved), [
                         f"accuracy {trained.accuracy:.3f} vs untrained {untrained.accuracy:.3f} on the same "
                         f"{trained.n} items: paired difference {diff:+.3f} ± {se:.3f} "
                         "(SE of the per-item differences)",
                         f"prior only {cell['mas_prior'].accuracy:.3f}; λ=0 {cell['lambda0'].accuracy:.3f}"]))
    ratio = trained.tokens_total_mean / untrained.tokens_total_mean if untrained.tokens_total_mean else float("nan")
    out.append(Claim("P3", f"total tokens per episode <= {r.proof_token_share:g}x the untrained MAS", _status(
        ratio <= r.proof_token_share, moved), [
        f"{trained.tokens_total_mean:.1f} vs {untrained.tokens_total_mean:.1f} tokens per episode: "
        f"{_ratio(ratio, r.proof_token_share)}x "
        f"(prompt {trained.tokens_prompt_mean:.1f} + completion {trained.tokens_completion_mean:.1f}; "
        f"calls skipped per episode {trained.calls_skipped:.2f} vs {untrained.calls_skipped:.2f})"]))
    cal = run.budget_calibration or {}
    target = float(cal.get("target", float("nan")))
    fraction, untrained_mean = float(cal.get("fraction", float("nan"))), float(cal.get("untrained_mean", 0))
    got_or_none, n = last_episodes(run.history, "train/budget_tokens", r.window)
    got = float("nan") if got_or_none is None else got_or_none
    err = (got - target) / target if target == target and target else float("nan")
    ok = n >= r.window and abs(err) <= r.proof_band
    settled, settle_why = controller_settled(run.history, rules) if ok else (None, "")
    status = _status(ok, moved) if not ok or settled else "INCONCLUSIVE"
    out.append(Claim("P4", f"mean completion tokens per episode within ±{r.proof_band:.0%} of B over the last "
                     f">= {r.window} training episodes (two-sided), held by the controller", status, [
                         f"B = {fraction:g} x {untrained_mean:.1f} "
                         f"(the untrained policy's sampled completion tokens per training episode, "
                         f"{int(float(cal.get('episodes', 0)))} episodes before step 1) = {target:.1f}",
                         f"last {n} training episodes: {got:.1f} tokens ({err:+.1%} from B)"
                         + _noise(run.history, target, rules),
                         *_why_off_budget(run.history, err, str(res.recipe.get("budget.mode") or "cap"), rules),
                         *([settle_why + ("" if settled else ": inside the band, but not held by λ")]
                           if ok else []),
                         *([e.text()] if (e := rule_at_endings(run.history, target, r.proof_band, rules)) else [])]))
    lam0 = cell["lambda0"]
    out.append(Claim("P5", "λ = 0 on the same task (reported, no verdict)", "REPORTED" if res.runs.get("lambda0") else
                     "NOT RUN", [
                         f"accuracy {lam0.accuracy:.3f}, {lam0.tokens_total_mean:.1f} total / "
                         f"{lam0.tokens_completion_mean:.1f} completion tokens per episode; silence uninformed "
                         f"{_pct(lam0.silence_uninformed)}, informed {_pct(lam0.silence_informed)}; "
                         f"{lam0.tokens_total_mean / trained.tokens_total_mean:.2f}x Agent-GSPO's total tokens",
                         *([f"λ=0 {'moved' if m.moved else 'did not move'} from its base policy: {m.why}"]
                           if (m := _lambda0_movement(res, rules)) else [])]))
    return out


def _why_off_budget(history: list[dict[str, float]], err: float, mode: str, rules: VerdictRules) -> list[str]:
    """Why a run ended outside the band: λ_tok's path, and whether the last steps had any reward spread
    within a group (GSPO's advantages are group-normalised: a group whose G episodes got the same
    reward gives no gradient, so no value of λ can move the policy)."""
    band, window = rules.proof_band, rules.window
    lam = [h["train/lambda_tok"] for h in history if "train/lambda_tok" in h]
    if not abs(err) > band or len(lam) < 2:
        return []
    lines = [f"λ_tok {lam[0]:.3f} at step 1, range [{min(lam):.3f}, {max(lam):.3f}], {lam[-1]:.3f} at the last "
             f"step (budget mode {mode})"]
    tail: list[dict[str, float]] = []
    for h in reversed(history):  # the steps of the last `window` episodes, as P4 counts them
        if "train/zero_adv_groups" in h and "train/adv_groups" in h:
            tail.append(h)
        if sum(t.get("train/episodes", 0.0) for t in tail) >= window:
            break
    flat = sum(h["train/zero_adv_groups"] for h in tail)
    groups = sum(h["train/adv_groups"] for h in tail)
    if groups and flat == groups:
        lines.append(f"every group of the last {len(tail)} steps ({int(groups)} of {int(groups)}) gave all its "
                     "episodes the same reward: zero advantages, no gradient, so λ_tok could not move token use "
                     "(the sampled policy had become deterministic at this temperature)")
    elif err < -band and mode == "cap":
        lines.append("below B, not above it: the policy needs fewer tokens than B allows, so the cap is slack "
                     "and λ_tok only decays at the dual learning rate")
    return lines


def _noise(history: list[dict[str, float]], target: float, rules: VerdictRules) -> str:
    """The judged window's standard error next to the band's half-width: a window whose noise is as wide
    as the band misses it often even when the controller is centred on B (reported, not a verdict)."""
    se = window_standard_error(history, "train/budget_tokens", rules.window)
    if se is None or not target == target:
        return ""
    return (f"; standard error {se:.2f} tokens from the spread of its steps' means, "
            f"against a band of ±{rules.proof_band * target:.2f}")


def _status(ok: bool, moved: bool) -> str:
    return "PASS" if ok and moved else "INCONCLUSIVE" if ok else "FAIL"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def proof_section(res: ProofResults, fig_dir: Path, rel: str,
                  rules: VerdictRules) -> tuple[list[str], list[Claim], dict[str, Path]]:
    """Markdown lines, verdicts and figures of one proof file, judged by ``rules``."""
    claims = proof_claims(res, rules)
    md = [f"## Silence proof ({res.name}): split information on the real model", "", res.description, ""]
    md += [f"Profile `{res.profile}` ({res.model}); held-out items: {res.limit or 'all'} of "
           f"{', '.join(res.benchmarks)}, disjoint from the training split; commit {res.git_commit or 'unknown'}; "
           f"{res.wall_seconds / 60:.0f} min in all (training {res.runs['agent_gspo'].train_seconds / 60:.0f} and "
           f"{res.runs['lambda0'].train_seconds / 60:.0f} min); machine: {describe(res.machine)}.", ""]
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


def _ratio(ratio: float, limit: float) -> str:
    """Two decimals, or four where two would print the threshold itself (0.3537 against 0.35 is a miss)."""
    two = f"{ratio:.2f}"
    return f"{ratio:.4f}" if two == f"{limit:.2f}" and ratio != limit else two
