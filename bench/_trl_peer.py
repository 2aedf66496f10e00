"""The peer side of ``bench/train_step.py``: TRL's ``GRPOTrainer`` in GSPO mode, fully offline.

Kept in its own module so the bench's main file stays readable and ``trl``/``accelerate`` are
imported only when the peer runs. Offline: the model object and tokenizer are passed in (built
by :func:`bench.common.build_policy`, also saved to a temp folder so nothing points at the
hub), prompts come from ``Dataset.from_list``, ``report_to="none"``, ``use_vllm=False``, output in
a temp folder, no saving.

GSPO mode as TRL documents it: ``importance_sampling_level="sequence"``, ``loss_type="grpo"``,
ε 3e-4 / 4e-4, ``beta=0``. Four optimizer mini-batches per generation batch:
``per_device_train_batch_size = Q*G/4``, ``steps_per_generation=4``,
``gradient_accumulation_steps=1``, ``num_iterations=1`` (TRL then computes π_old log-probs once
per generation batch, like our trainer).

Timing: a ``TrainerCallback`` stamps the end of every optimizer step; the timed window runs from
the end of the warm-up generation batch (its 4th update) to the end of the last update, so it
holds ``steps`` generations and ``4*steps`` updates. Completion tokens are counted from the
``completion_ids`` TRL passes to the reward function (what it generated, EOS-truncated).
"""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

from bench.common import BenchSettings, SideResult, build_policy, chat_prompt, letter_parity_reward, sync
from components.data.item import Item


def _text(completion: Any) -> str:
    """TRL passes conversational completions as ``[{"role": "assistant", "content": ...}]``."""
    if isinstance(completion, list):
        return "".join(str(m.get("content", "")) for m in completion)
    return str(completion)


def run_trl(s: BenchSettings, items: list[Item], continuous_batching: bool = False) -> SideResult:
    """One warm-up generation batch + ``s.steps`` timed ones through ``GRPOTrainer.train``.

    ``continuous_batching``: TRL's transformers continuous-batching path
    (``use_transformers_continuous_batching=True``) instead of ``model.generate``."""
    import warnings

    import transformers
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)  # TRL/transformers deprecation notes
    torch.manual_seed(s.seed)
    model, tok = build_policy(s)  # same seed -> the same initial weights as our side
    per_step = s.completions // s.minibatches
    total_updates = (s.steps + 1) * s.minibatches

    calls: list[tuple[int, float]] = []  # (completion tokens, mean reward) per generation batch

    def reward(completions: list[Any], completion_ids: list[list[int]] | None = None, **_: Any) -> list[float]:
        values = [letter_parity_reward(_text(c)) for c in completions]
        calls.append((sum(len(ids) for ids in completion_ids or []), sum(values) / max(1, len(values))))
        return values

    gen_times: list[float] = []
    gen_name = "generate_batch" if continuous_batching else "generate"
    inner_generate = getattr(model, gen_name)

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        sync(s.device)
        t0 = time.perf_counter()
        out = inner_generate(*args, **kwargs)
        sync(s.device)
        gen_times.append(time.perf_counter() - t0)
        return out

    setattr(model, gen_name, timed_generate)  # measurement only: TRL's unwrapped model is this object

    stamps: dict[int, tuple[float, float]] = {}  # optimizer step -> (wall, process CPU) time at its end

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            sync(s.device)
            stamps[state.global_step] = (time.perf_counter(), time.process_time())

    with tempfile.TemporaryDirectory(prefix="bench-trl-") as tmp:
        model.save_pretrained(f"{tmp}/model")  # a local copy, as a user would have; nothing on the hub
        tok.save_pretrained(f"{tmp}/model")
        on_cuda = s.device.startswith("cuda")
        args = trl.GRPOConfig(
            output_dir=f"{tmp}/out", report_to="none", use_vllm=False, use_cpu=not on_cuda, bf16=on_cuda,
            seed=s.seed, max_steps=total_updates, save_strategy="no", logging_strategy="no", disable_tqdm=True,
            per_device_train_batch_size=per_step, gradient_accumulation_steps=1, steps_per_generation=s.minibatches,
            num_iterations=1, num_generations=s.group, max_completion_length=s.tokens,
            generation_kwargs={"min_new_tokens": s.tokens}, temperature=s.temperature, top_p=1.0, top_k=0,
            importance_sampling_level="sequence", loss_type="grpo", epsilon=3e-4, epsilon_high=4e-4, beta=0.0,
            learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0,
            optim="adamw_torch", gradient_checkpointing=False, dataloader_num_workers=0, shuffle_dataset=False,
            use_transformers_continuous_batching=continuous_batching)
        dataset = Dataset.from_list([{"prompt": chat_prompt(item)} for item in items])
        trainer = trl.GRPOTrainer(model=model, args=args, processing_class=tok, reward_funcs=reward,
                                  train_dataset=dataset, callbacks=[Clock()])
        trainer.remove_callback(PrinterCallback)  # no metrics dict on stdout
        trainer.train()

    start, end = stamps.get(s.minibatches), stamps.get(total_updates)
    if start is None or end is None or len(calls) < s.steps + 1:
        raise RuntimeError(f"TRL ran {len(stamps)} optimizer steps and {len(calls)} generation batches; "
                           f"expected {total_updates} and {s.steps + 1}")
    timed = calls[1: s.steps + 1]
    texts = [tok.apply_chat_template(chat_prompt(item), add_generation_prompt=True, tokenize=False)
             for item in items[s.questions: s.questions * (s.steps + 1)]]  # the timed steps' prompts
    prompt_lens = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
    return SideResult("trl_cb" if continuous_batching else "trl", sum(n for n, _ in timed), end[0] - start[0],
                      s.steps, total_updates - s.minibatches, end[1] - start[1],
                      {"generate_s": sum(gen_times[1: s.steps + 1]), "trl_version": trl.__version__,
                       "mean_prompt_tokens": sum(prompt_lens) / len(prompt_lens),
                       "mean_reward": sum(r for _, r in timed) / len(timed)})


