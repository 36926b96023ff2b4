/**
 * The Tinker API's wire types as Effect Schemas, transcribed from the official Python SDK and named as it names them.
 *
 * **Source.** `thinking-machines-lab/tinker`, SDK version **0.25.0** (`pyproject.toml`), commit **d595dc2**
 * ("Sync contents", 2026-08-08): `src/tinker/types/*.py` (pydantic models; `_pydantic_types/` where the public type is
 * a dataclass over numpy) and `docs/api/types.md`. The three response types that HEAD turned into numpy dataclasses
 * (`SampleResponse`, `SampledSequence`, `ForwardBackwardOutput`) keep the JSON form Stainless generated from the
 * OpenAPI document at the SDK's first commit 829c151, which open servers (SkyRL's `skyrl/tinker/types.py`) still
 * send. The OpenAPI document itself (`.stats.yml`: `openapi_spec_hash ed32399a…`) is not reachable from here.
 *
 * **JSON form.** Each Schema's encoded side is what pydantic's `model_dump(mode="json", exclude_none=True)` writes
 * (the SDK posts bodies that way): a field with a default is written with its value, an `Optional[...] = None` field
 * is left out. Decoding is as lenient as pydantic: a defaulted field may be absent (its default is filled in), an
 * optional field may be absent or `null` (servers built on FastAPI write `null`s), unknown keys are ignored.
 *
 * **Not here**: the protobuf body the SDK ≥ 0.25 posts to `forward_backward` (see `docs/tinker.md`), telemetry,
 * billing, the checkpoints listing route (the archive route's answer is here: `CheckpointArchiveUrlResponse`).
 *
 * @since 0.1.0
 */

/** The SDK release and commit these Schemas were transcribed from. */
export const sdk = { name: "tinker", version: "0.25.0", commit: "d595dc2" } as const

export * from "./internal/dataTypes.ts"
export { encodeJson } from "./internal/fields.ts"
export * from "./internal/serviceTypes.ts"
