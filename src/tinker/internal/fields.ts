/**
 * How the Tinker Schemas write pydantic's fields (`../Types.ts`): optional keys, defaults, `type` tags.
 *
 * @since 0.1.0
 */
import { Effect, Option, Schema, SchemaGetter } from "effect"

/** `Optional[X] = None`: absent when None (`exclude_none`); `null` is accepted on decoding and read as absent. */
export const optional = <S extends Schema.Top>(schema: S) =>
  Schema.optionalKey(Schema.NullOr(schema)).pipe(Schema.decodeTo(Schema.optionalKey(Schema.toType(schema)), {
    decode: SchemaGetter.transformOptional(Option.filter((v) => v !== null)),
    encode: SchemaGetter.passthrough()
  }))

/** A field with a pydantic default: filled in on decoding when absent, always written. */
export const withDefault = <S extends Schema.Top>(schema: S, value: S["Encoded"]) =>
  schema.pipe(Schema.withDecodingDefaultKey<S, never>(Effect.succeed(value)))

/** The `type` discriminator pydantic writes with its default. */
export const tag = <const L extends string>(literal: L) => withDefault(Schema.Literal(literal), literal)

/** `Optional[Literal[...]] = None`: a response's `type`, absent or null on some servers. */
export const optionalTag = <const L extends string>(literal: L) => optional(Schema.Literal(literal))

/** Free-form metadata (`dict[str, Any]`). */
export const Metadata = Schema.Record(Schema.String, Schema.Unknown)

/** `Dict[str, float]`. */
export const Metrics = Schema.Record(Schema.String, Schema.Number)

/**
 * `value` as JSON through `schema` (what goes on the wire).
 *
 * @category constructors
 * @since 0.1.0
 */
export const encodeJson = <S extends Schema.Codec<any, any, never, never>>(schema: S, value: S["Type"]): unknown =>
  Schema.encodeSync(schema)(value)
