"""Human-readable transcripts and batch summaries of episodes (for logs, artifacts and reports)."""

from __future__ import annotations

from statistics import fmean

from components.mas.records import Episode


def format_transcript(episode: Episode, tokenizer=None) -> str:
    """Who said what, in order: silent turns, tokens per message and delivery, then the totals.

    Message text comes from ``Message.text``; when it is empty and a tokenizer is given, the
    completion ids are decoded (the records never require re-tokenising).
    """
    lines = [f"== {episode.question_id} [{episode.benchmark}] episode {episode.group_index} =="]
    for m in episode.messages:
        text = m.text
        if not text and tokenizer is not None:
            text = tokenizer.decode(m.completion_ids, skip_special_tokens=False)
        head = (f"[round {m.round + 1}] agent {m.agent_id + 1} ({m.role}) "
                f"prompt={m.prompt_tokens} completion={m.completion_tokens}")
        if m.silent:
            lines.append(f"{head} SILENT (not delivered)")
            continue
        to = ",".join(str(r + 1) for r in m.recipients) or "nobody"
        lines.append(f"{head} -> {to} communicated={m.communicated_tokens}")
        lines.extend("    " + row for row in (text.strip() or "<empty>").splitlines())
    lines.append(f"tokens: prompt={episode.prompt_tokens} completion={episode.completion_tokens} "
                 f"communicated={episode.communicated_tokens} total={episode.total_tokens} "
                 f"turns={episode.turns} silence_rate={episode.silence_rate:.2f}")
    final = episode.final_answer.strip().replace("\n", " ")
    if len(final) > 200:
        final = final[:200] + "..."
    lines.append(f"final answer: {final or '<none>'} | extracted={episode.extracted!r} "
                 f"correct={episode.correct}" + (f" error={episode.score_error}" if episode.score_error else ""))
    return "\n".join(lines)


def episodes_summary(episodes: list[Episode]) -> dict[str, float]:
    """Means over episodes (the metric vocabulary of docs/architecture.md, without the prefix).

    ``silence_rate`` is pooled over all messages (silent messages / messages), not a mean of
    per-episode rates, so episodes with more messages weigh more — the quantity the reward sees.
    """
    if not episodes:
        return {"episodes": 0}
    n_msgs = sum(len(e.messages) for e in episodes)
    return {
        "episodes": len(episodes),
        "accuracy": fmean(float(e.correct) for e in episodes),
        "tokens_prompt": fmean(e.prompt_tokens for e in episodes),
        "tokens_completion": fmean(e.completion_tokens for e in episodes),
        "tokens_communicated": fmean(e.communicated_tokens for e in episodes),
        "tokens_total": fmean(e.total_tokens for e in episodes),
        "turns": fmean(e.turns for e in episodes),
        "messages": n_msgs / len(episodes),
        "silence_rate": sum(m.silent for e in episodes for m in e.messages) / max(1, n_msgs),
        "repetition": fmean(e.reward.repetition if e.reward is not None else 0.0 for e in episodes),
    }
