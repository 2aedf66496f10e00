"""A step whose update could not change the policy says so (step line, gspo/* metrics)."""

from __future__ import annotations

import pytest

from components.gspo.trainer import noop_reason
from components.tracking.metric_names import EXTRA_METRIC_NAMES


@pytest.mark.parametrize(("metrics", "reason"), [
    ({"train/adv_groups": 4.0, "train/zero_adv_groups": 4.0, "gspo/grad_norm": 0.0}, "all 4 advantage groups zero"),
    ({"train/adv_groups": 1.0, "train/zero_adv_groups": 1.0}, "all 1 advantage group zero"),
    ({"train/adv_groups": 4.0, "train/zero_adv_groups": 1.0, "gspo/clip_frac_low": 0.5, "gspo/clip_frac_high": 0.5},
     "every ratio clipped"),
    ({"train/adv_groups": 4.0, "train/zero_adv_groups": 3.0, "gspo/grad_norm": 0.0}, "zero gradient"),
    ({"train/adv_groups": 4.0, "train/zero_adv_groups": 3.0, "gspo/clip_frac_low": 0.2, "gspo/grad_norm": 0.1},
     None),
])
def test_noop_reason(metrics: dict[str, float], reason: str | None) -> None:
    assert noop_reason(metrics) == reason


def test_the_new_metrics_are_in_the_vocabulary() -> None:
    assert {"gspo/zero_adv_groups_frac", "gspo/noop_step"} <= EXTRA_METRIC_NAMES


@pytest.mark.slow  # one tiny-random training step under the smoke profile: ~45 s on 2 busy cores
def test_the_tiny_model_smoke_step_says_it_changed_nothing(tmp_path, capsys) -> None:
    """The smoke profile on tiny-random: every reply runs to the cap, both episodes of the one
    question earn the same reward, so the one advantage group is zero and the update is a no-op."""
    from helpers.learning_env import ITEMS

    from components.config import load_config
    from components.runtime.training_run import train

    cfg = load_config(profile="smoke", overrides=["model.name=tiny-random", "model.gradient_checkpointing=false",
                                                  "tracking.log_model=false", "gspo.checkpoint_every=100"])
    result = train(cfg, items=ITEMS, out_dir=tmp_path, track=False, max_steps=1)
    step = result.history[0]
    assert step["gspo/zero_adv_groups_frac"] == 1.0 and step["gspo/noop_step"] == 1.0
    assert step["gspo/grad_norm"] == 0.0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("step 1/1"))
    assert line.endswith("no-op: all 1 advantage group zero"), line
    assert "Setting accelerator to CPU" not in out


def test_deepspeed_cpu_warning_is_dropped_in_a_torch_engine_run() -> None:
    import logging

    from components.runtime.distributed import quiet_deepspeed_cpu_warning

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("DeepSpeed")
    handler = Keep()
    logger.addHandler(handler)
    try:
        quiet_deepspeed_cpu_warning()
        quiet_deepspeed_cpu_warning()  # once is enough, twice adds nothing
        logger.warning("Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it.")
        logger.warning("something else")
    finally:
        logger.removeHandler(handler)
    assert seen == ["something else"]
    assert len(logger.filters) == 1
