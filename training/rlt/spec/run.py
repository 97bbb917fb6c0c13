"""The run: RLTRunSpec (with its cross-field rules) and the RLTRun resource around it."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rlt.contract.api import (
    GROUP_VERSION,
    KIND,
    Strict,
)
from rlt.contract.method_registry import METHOD_NAMES, method_info
from rlt.contract.outputs import RUN_PRODUCTS
from rlt.contract.stage_registry import STAGE_ORDER, STAGES, method_stages, producer_of, stage_info
from rlt.spec.inputs import DatasetSpec, FormatSpec, ModelRef
from rlt.spec.k8s import DNS1123Label, LabelValue, QualifiedName, RunName, cel_rules
from rlt.spec.k8s_api import ObjectMeta
from rlt.spec.resources import (
    EnvVar,
    Images,
    Resources,
    Scheduling,
    SecretEnvVar,
    SecretKeyRef,
    Storage,
)
from rlt.spec.stage_settings import StageSettings
from rlt.spec.stages import Stages, generation
from rlt.spec.tracking_outputs import OutputsSpec, TrackingSpec

# --------------------------------------------------------------------------- the run

MAX_SEED = 2**32 - 1  # numpy.random.seed (transformers.set_seed seeds it) takes 0 .. 2**32 - 1


def _stage_cel_rules() -> list[tuple[str, ...]]:
    """Every stage's CEL rules across the run's fields, from its settings model (StageSettings.run_cel_rules)."""
    rules: list[tuple[str, ...]] = []
    for name in STAGE_ORDER:
        model = Stages.model_fields[name].annotation
        if not (isinstance(model, type) and issubclass(model, StageSettings)):
            raise TypeError(f"spec.stages.{name}: {model} is not a StageSettings (rlt.spec.stages)")
        rules += model.run_cel_rules(name)
    return rules


class RclSpec(Strict):
    """RCL adaptive teaching (method: rcl): probe → guidance → reward from the student's gain, losses cost double."""

    max_probe_tokens: int = Field(50, gt=0, description="Length limit of the student's diagnostic probe.")
    student_samples: int = Field(
        4, gt=0, description="Student answers per question and condition (with/without guidance)."
    )
    max_student_tokens: int = Field(512, gt=0, description="Length limit of each student answer.")
    degradation_penalty: float = Field(
        2.0, ge=0, description="Multiplier of a loss (Δ < 0): 2 = a loss costs twice a gain."
    )
    efficiency_weight: float = Field(
        0.5, ge=0, description="w: weight of the conciseness bonus eff = L0 / (L0 + tokens)."
    )
    efficiency_tokens: int = Field(200, gt=0, description="L0 of the conciseness bonus.")
    maintain_bonus: float = Field(0.1, ge=0, description="Bonus (×w·eff) when a strong student stays right (Δ = 0).")
    strong_threshold: float = Field(
        0.75, ge=0, le=1, description="Baseline accuracy at or above which the student counts as strong."
    )
    answer_leak_penalty: float = Field(
        0.0, ge=0, description="Subtracted when the guidance states the reference answer."
    )
    format_penalty: float = Field(
        1.0,
        ge=0,
        description="Reward (negated) of a teacher output without closed guidance tags; nothing is passed on.",
    )
    format: str = Field(
        "rcl-default",
        min_length=1,
        description="Prompts and tags of both passes: a bundled rcl format (rlt/method/formats/<name>.yaml) or a YAML file path.",
    )
    performance: Literal["accuracy", "dense"] = Field(
        "accuracy",
        description="accuracy: share of correct student answers; dense: student's tempered log-prob of the solution.",
    )


class RLTRunSpec(Strict):
    model_config = ConfigDict(json_schema_extra=cel_rules(*_stage_cel_rules()))

    # a name of the method table (rlt.contract.method_registry), checked against it when read; the CRD lists them
    method: str = Field(
        "rlt",
        description="Teaching method: rlt (Sakana RLT) or rcl (adaptive teaching).",
        json_schema_extra={"enum": list(METHOD_NAMES)},
    )
    rcl: RclSpec = Field(default_factory=RclSpec, description="Settings of method rcl (ignored by rlt).")
    teacher: ModelRef = Field(description="Teacher model trained by SFT and RL.")
    student: ModelRef = Field(description="Frozen student that scores explanations.")
    dataset: DatasetSpec = Field(description="Questions and reference solutions: source, split, columns.")
    format: FormatSpec = Field(default_factory=FormatSpec, description="Prompt format (preset or file) and overrides.")
    stages: Stages = Field(default_factory=Stages, description="The stages of the run and their settings.")
    seed: int = Field(42, ge=0, le=MAX_SEED, description="Seed of training and sampling (numpy's seed: below 2**32).")
    # cluster-only fields (ignored by `rlt run`)
    resources: Resources = Field(default_factory=Resources)
    storage: Storage = Field(default_factory=Storage)
    images: Images = Field(default_factory=Images)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment for every pod.")
    hf_token_secret: SecretKeyRef | None = Field(None, description="Secret holding a Hugging Face token.")
    tracking: TrackingSpec = Field(
        default_factory=TrackingSpec, description="Experiment tracking (TensorBoard, W&B, MLflow)."
    )
    outputs: OutputsSpec = Field(default_factory=OutputsSpec, description="Copies of the results off the volume.")
    suspend: bool = Field(
        False, description="Delete the run's pods and keep its data; resume from the last checkpoint."
    )
    backoff_limit: int = Field(3, ge=0, description="Gang restarts allowed before the run fails.")
    replacement_limit: int = Field(
        6,
        ge=0,
        description="ReadWriteOnce volume with generators: times the gang is released and placed again together "
        "(a trainer pod unschedulable for 10 min beside the generators) before the run fails; not counted against "
        "backoffLimit.",
    )
    active_deadline_seconds: int | None = Field(None, gt=0, description="Fail the run after this long.")
    ttl_seconds_after_finished: int | None = Field(
        None, ge=0, description="Delete the run's pods this long after it ends."
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, v: str) -> str:
        method_info(v)  # a ValueError naming the methods of the table
        return v

    @model_validator(mode="after")
    def _some_stage(self) -> RLTRunSpec:
        # Every broken rule, one line each (rlt.spec.loading splits them): the CRD's CEL rules report each too.
        problems: list[str] = []
        if not self.stages.enabled():
            problems.append("stages: enable at least one of " + ", ".join(STAGE_ORDER))
        # each stage's settings model holds its own rules across the run's fields (rlt.spec.stages.StageSettings)
        for name in STAGE_ORDER:
            problems += getattr(self.stages, name).run_problems(name, self)
        # A method runs its own stages only (rcl teaches at answer time: no distillation dataset, no student stage).
        own = method_stages(self.method)
        for name in STAGE_ORDER:
            if name not in own and getattr(self.stages, name).enabled:
                problems.append(
                    f"stages: method {self.method} has no {name} stage; set stages.{name}.enabled: false "
                    f"({self.method} runs {', '.join(own)})"
                )
        # LoRA trains an adapter: only where a stage trains the model
        for where, ref in (("student", self.student), ("stages.evaluate.model", self.stages.evaluate.model)):
            if ref is not None and ref.lora is not None:
                problems.append(f"{where}.lora: an adapter is for trained models only (teacher, stages.student.model)")
        # a destination needs a stage producing what it names (the stage table's roles)
        for product in RUN_PRODUCTS:
            if getattr(self.outputs, product.attr) and producer_of(product.role, self.stages.enabled()) is None:
                makers = [s.name for s in STAGES if s.produces == product.role and s.name in own]
                needs = (
                    " or ".join(f"stages.{s}.enabled" for s in makers)
                    or f"a method with such a stage (not {self.method})"
                )
                problems.append(
                    f"outputs: outputs.{product.output} needs {needs} (a stage producing the {product.role})"
                )
        hub = [u for p in RUN_PRODUCTS if (u := getattr(self.outputs, p.attr)) and u.startswith("hf://")]
        if hub and self.hf_token_secret is None:
            problems.append("outputs: pushing to the Hugging Face Hub needs spec.hfTokenSecret")
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def named_models(self) -> list[tuple[str, ModelRef, str | None]]:
        """The one list of the models the run names: (spec field, ref, the stage whose settings name it or None)."""
        out: list[tuple[str, ModelRef, str | None]] = [("spec.teacher", self.teacher, None)]
        out.append(("spec.student", self.student, None))
        for name in STAGE_ORDER:
            out += [(where, ref, name) for where, ref in stage_settings(self, name).named_models(name)]
        return out

    def named_datasets(self) -> list[tuple[str, DatasetSpec, str | None]]:
        """The one list of the datasets the run names, as named_models."""
        out: list[tuple[str, DatasetSpec, str | None]] = [("spec.dataset", self.dataset, None)]
        for name in STAGE_ORDER:
            out += [(where, ds, name) for where, ds in stage_settings(self, name).named_datasets(name)]
        return out

    def secret_env(self) -> list[SecretEnvVar]:
        """Every Secret-backed variable the run's pods need for tracking and outputs (HF_TOKEN is separate)."""
        out = list(self.outputs.credentials)
        if self.tracking.wandb and self.tracking.wandb.api_key_secret:
            out.append(SecretEnvVar(name="WANDB_API_KEY", secret_key_ref=self.tracking.wandb.api_key_secret))
        if self.tracking.mlflow:
            out += self.tracking.mlflow.credentials
        return out


MAX_ANNOTATIONS = 256 * 1024  # the API server's bound on the total size of an object's annotations


class Metadata(ObjectMeta):  # type: ignore[misc, valid-type]
    """Kubernetes' ObjectMeta (rlt.spec.k8s_api: the fields the API server fills in, as in a manifest exported from a
    cluster, are accepted; unknown fields are not), with the name, label and annotation rules the API server
    applies."""

    name: RunName
    namespace: DNS1123Label | None = None
    labels: dict[QualifiedName, LabelValue] = Field(default_factory=dict)
    annotations: dict[QualifiedName, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _annotations_fit(self) -> Metadata:
        size = sum(len(k.encode()) + len(v.encode()) for k, v in self.annotations.items())
        if size > MAX_ANNOTATIONS:
            raise ValueError(f"annotations: {size} bytes in all, over the API server's {MAX_ANNOTATIONS}")
        return self


class RLTRun(BaseModel):
    model_config = ConfigDict(extra="forbid")
    api_version: str = Field(alias="apiVersion")
    kind: str

    # Checked by value (not a Literal type) so that the group, version and kind are written once, in rlt.contract.api.
    @field_validator("api_version")
    @classmethod
    def _api_version(cls, v: str) -> str:
        if v != GROUP_VERSION:
            raise ValueError(f"Input should be '{GROUP_VERSION}'")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"Input should be '{KIND}'")
        return v

    metadata: Metadata
    spec: RLTRunSpec
    status: dict[str, Any] | None = Field(None, description="Written by the operator; ignored on input.")

    @property
    def name(self) -> str:
        return self.metadata.name


# --------------------------------------------------------------------------- a stage's settings in a spec


def stage_settings(spec: RLTRunSpec, name: str) -> Any:
    """spec.stages.<name>."""
    return getattr(spec.stages, stage_info(name).name)


def zero_stage(spec: RLTRunSpec, name: str) -> int | None:
    """The DeepSpeed ZeRO stage of a Trainer stage (its deepspeedZeroStage): the one value both the accelerate
    launch and the Trainer's DeepSpeed config read. None for the stages without a Trainer."""
    if not stage_info(name).trainer:
        return None
    zero: int = stage_settings(spec, name).deepspeed_zero_stage
    return zero


def needs_generators(spec: RLTRunSpec, name: str) -> bool:
    """vLLM generators run beside the stage's trainer: it samples from the teacher and rl generates in server mode."""
    return stage_info(name).uses_generators and generation(spec).mode == "server"


def reads_run_dataset(spec: RLTRunSpec, name: str) -> bool:
    """Whether the stage reads spec.dataset (evaluate does unless stages.evaluate.dataset names its own data)."""
    return stage_info(name).reads_dataset and getattr(stage_settings(spec, name), "dataset", None) is None
