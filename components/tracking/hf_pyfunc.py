"""MLflow "models from code" definition of a registered version: the trained multi-agent system.

MLflow copies this file into the logged model and executes it at load time
(``mlflow.pyfunc.load_model``, ``mlflow models serve``); the library never imports it. The
project's ``components`` package travels with the model (``code_paths``), so a version keeps
answering with the code it was trained with. Artifacts: ``hf_model`` (the untouched HF policy
folder, which :func:`components.tracking.policy_model.resolve_model_uri` hands to
``from_pretrained``) and ``system`` (the recorded settings, see
:mod:`components.tracking.served`).

Why pyfunc and not ``mlflow.transformers.log_model``: the product is N agents talking for T
rounds, not one text completion; and with transformers 5.24 the transformers flavour cannot log
a saved folder (its pipeline-task lookup fails).
"""

from __future__ import annotations

from typing import Any

import mlflow
import pandas as pd
from mlflow.exceptions import MlflowException
from mlflow.pyfunc import PythonModel

from components.tracking.served import RequestError, ServedSystem
from components.tracking.served_inputs import request_rows


class MultiAgentSystemModel(PythonModel):
    """Input: rows with ``question`` (and optionally ``answer_type``, ``choices``), as records or as
    columns (:func:`components.tracking.served_inputs.request_rows`). Output: one object
    per row with the final answer, the transcript and the token counts. Params: ``agents``,
    ``rounds``, ``max_new_tokens``, ``temperature``, ``seed``."""

    def load_context(self, context: Any) -> None:
        self.system = ServedSystem.load(context.artifacts["hf_model"], context.artifacts["system"])

    # ``pd.DataFrame`` tells MLflow not to infer a schema from the hint (the signature logged with
    # the model, with its params schema, is the contract).
    def predict(self, context: Any, model_input: pd.DataFrame,
                params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        frame = model_input if isinstance(model_input, pd.DataFrame) else pd.DataFrame(model_input)
        try:  # NaN cells (pandas fills absent values with NaN) become None; columns become rows
            return self.system.answer(request_rows(frame.to_dict("records")), params)
        except RequestError as exc:
            raise MlflowException.invalid_parameter_value(str(exc)) from None


mlflow.models.set_model(MultiAgentSystemModel())
