"""Flow parameters that never carry a secret into Prefect's database.

Prefect stores a flow run's parameters when the run is *created*, before any flow code runs: by
the server for a deployment run (``prefect deployment run``, the UI, the API, the scheduler), by
the engine in this process for a direct call. So a refusal inside the flow comes too late. Two
guards, one per way a run is created:

* **deployment runs**: every string parameter of the deployed flows is :data:`SecretFree`. Its
  JSON schema carries :data:`components.redact.SECRET_FREE_PATTERN`, which ``prefect deploy``
  stores in the deployment's parameter schema; the server validates a new run's parameters
  against it (Prefect 3 enforces deployment parameter schemas by default) and answers 409 without
  storing the run when a value holds ``scheme://user:password@`` or a secret query parameter;
* **direct calls** (``pipeline_flow(overrides=[...])`` in Python): :func:`redacting` makes the
  flow store its parameters through :func:`components.redact.redact_value`, and the same type
  then refuses the value when the flow validates its parameters, with a message naming the
  environment variables to use instead.

``agent-gspo run`` moves a ``tracking.uri`` password into ``$MLFLOW_TRACKING_URI`` before the flow
starts (``flows.pipeline.secrets_kept_out``), so it passes both guards. See docs/hardening.md for
what is not covered (a client that turns schema enforcement off, job variables, deployment
defaults written into prefect.yaml -- the last checked by a test).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from prefect import Flow
from pydantic import AfterValidator, Field

from components.redact import SECRET_FREE_PATTERN, redact, redact_value

SECRET_HELP = ("a password or token in a flow parameter would be stored in Prefect's database; give the "
               "tracking server's credentials to the process that runs the flow instead "
               "(MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD, or MLFLOW_TRACKING_TOKEN, with "
               "tracking.uri / MLFLOW_TRACKING_URI free of them), and a database password to the params file")


def _refuse_secret(value: str) -> str:
    if redact(value) != value:
        raise ValueError(f"{redact(value)!r}: {SECRET_HELP}")
    return value


SecretFree = Annotated[str, AfterValidator(_refuse_secret), Field(json_schema_extra={"pattern": SECRET_FREE_PATTERN})]
"""A string flow parameter that refuses a URI password or secret query parameter (see above)."""

F = TypeVar("F", bound=Flow)


def redacting(flow_obj: F) -> F:
    """``flow_obj`` storing its parameters redacted when this process creates its run (a direct
    call or a subflow): the flow still receives the values it was called with. An instance
    attribute, as Prefect builds the run's stored parameters with ``flow.serialize_parameters``."""
    serialize = flow_obj.serialize_parameters

    def serialize_redacted(parameters: dict[str, Any]) -> dict[str, Any]:
        return redact_value(serialize(parameters))

    flow_obj.serialize_parameters = serialize_redacted  # type: ignore[method-assign]
    return flow_obj
