"""MLflow "models from code" definition of the policy as a pyfunc model.

MLflow copies this file into the logged model and executes it at load time
(``mlflow.pyfunc.load_model``); the library never imports it. It must therefore depend only
on mlflow, transformers and torch. The HF folder (weights + tokenizer) travels untouched as
the ``hf_model`` artifact, so :func:`components.tracking.policy_model.resolve_model_uri` can
hand that folder straight to ``from_pretrained``.

Why pyfunc and not ``mlflow.transformers.log_model``: with transformers 5.24 the transformers
flavour cannot log a saved folder (its pipeline-task lookup fails), and logging in-memory
objects re-saves the weights, splits the tokenizer into ``components/tokenizer``, needs
torchvision for its default requirements and took ~16 s for a 70 kB model versus ~1 s here.
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class HFCausalLMPolicy(PythonModel):
    """Greedy / sampled text generation with the logged causal LM.

    Input: a list of prompts or a one-column DataFrame of strings (MLflow converts a list to a
    DataFrame). Output: list of completions (text after the prompt). Params:
    ``max_new_tokens`` (int), ``temperature`` (float, 0 = greedy).
    """

    def load_context(self, context: Any) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        folder = context.artifacts["hf_model"]
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder)
        self.model.eval()

    # ``pd.DataFrame`` tells MLflow not to infer a schema from the hint (the explicit signature
    # logged with the model, with its params schema, is the contract).
    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[str]:
        import torch

        params = params or {}
        prompts = [str(p) for p in model_input.iloc[:, 0]]  # (n_prompts,) first column
        temperature = float(params.get("temperature", 0.0))
        outputs: list[str] = []
        for prompt in prompts:
            enc = self.tokenizer(str(prompt), return_tensors="pt")
            with torch.no_grad():
                ids = self.model.generate(
                    **enc, max_new_tokens=int(params.get("max_new_tokens", 64)),
                    do_sample=temperature > 0, temperature=temperature if temperature > 0 else None,
                    pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
            new_ids = ids[0, enc["input_ids"].shape[1]:]  # (new_tokens,)
            outputs.append(self.tokenizer.decode(new_ids, skip_special_tokens=True))
        return outputs


mlflow.models.set_model(HFCausalLMPolicy())
