/**
 * Tools an agent can call: a name, a description, a parameter Schema (rendered as JSON Schema into the chat
 * template's tool list), success and failure Schemas, and a handler Effect.
 *
 * The shape is `effect/ai`'s `Tool.make` (each tool also carries the equivalent `effect/ai` definition in
 * `definition`, whose JSON Schema rendering we reuse), with what RL needs on top:
 * - the handler lives on the tool, so the tool actor can run it without building a `Toolkit` stream per call
 *   (the hot path: see `bench/tools.ts`);
 * - `failureMode` defaults to `"return"`: a typed failure becomes an observation the model sees;
 * - per-tool execution policy: `timeout`, `concurrency` (a limit shared by all chains of a run), `retry` on
 *   retryable failures, an output budget, and `terminal` for tools that end the chain (`answer`);
 * - `dependencies`: the environment services the handler needs, provided per rollout chain (see
 *   `Environment.ts` for the contract).
 *
 * Methods of an environment service (a class instance held in a `Context.Service`) become tools bound to the
 * chain's instance with {@link methods}.
 *
 * The texts of failed calls are fixed here ({@link errorText}), so that rewards can tell a malformed call (bad
 * arguments, unknown tool) from a call that failed at run time ({@link formatErrorOf}).
 *
 * @since 0.1.0
 */
import { Cause, Context, Duration, Effect, Exit, Option, Schema, SchemaAST } from "effect"
import type { Schedule } from "effect"
import { Tool as AiTool } from "effect/ai"
import type * as Message from "./Message.ts"

// ===== Models =====

const TypeId = "~agentfly/Tool" as const

/**
 * What a handler receives besides its decoded parameters.
 *
 * @category models
 * @since 0.1.0
 */
export interface HandlerContext {
  /** The id of the call being answered (the `tool_call_id` of the observation). */
  readonly toolCallId: string
}

/**
 * Retries of a call whose attempt failed with a retryable failure: a timeout, or a failure whose
 * `isRetryable` is true (e.g. `Environment.EnvError` with reason `Crashed`).
 *
 * @category models
 * @since 0.1.0
 */
export interface RetryPolicy {
  /** Retries after the first attempt. */
  readonly times: number
  /** Delays between attempts (default: exponential from 100 ms). */
  readonly schedule?: Schedule.Schedule<unknown, unknown> | undefined
}

/**
 * The most an observation may hold; longer text is cut and ends with an explicit marker. `tokens` needs the
 * tool actor to have a tokenizer.
 *
 * @category models
 * @since 0.1.0
 */
export interface OutputBudget {
  readonly chars?: number | undefined
  readonly tokens?: number | undefined
}

/**
 * A tool: definition plus handler plus execution policy.
 *
 * @category models
 * @since 0.1.0
 */
export interface Tool<
  Name extends string,
  Params extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top,
  R = never
> {
  readonly [TypeId]: typeof TypeId
  readonly name: Name
  readonly description: string
  readonly parametersSchema: Params
  readonly successSchema: Success
  readonly failureSchema: Failure
  /** `"return"`: a typed failure is an observation; `"error"`: it fails the turn (the chain's error policy). */
  readonly failureMode: "return" | "error"
  /** The environment services the handler needs, provided per chain. */
  readonly dependencies: ReadonlyArray<Context.Key<any, any>>
  /** Whether a successful call ends the chain; its rendered output is the final answer. */
  readonly terminal: boolean
  /** Reject arguments with properties the parameter Schema does not declare (and say so in the JSON Schema). */
  readonly strict: boolean
  readonly timeout: Duration.Duration | undefined
  readonly concurrency: number | undefined
  readonly retry: RetryPolicy | undefined
  readonly maxOutput: OutputBudget | undefined
  /**
   * Renders a success value as the observation (default: strings as is, other values as JSON). A list of content
   * parts is an observation with images (`image_url` parts with `data:` URLs: a screen, a plot), for a vision model.
   */
  readonly render: ((value: Success["Type"]) => string | ReadonlyArray<Message.ContentPart>) | undefined
  readonly handler: (
    params: Params["Type"],
    context: HandlerContext
  ) => Effect.Effect<Success["Type"], Failure["Type"], R>
  /** The equivalent `effect/ai` tool definition (for interop and JSON Schema rendering). */
  readonly definition: AiTool.Any
  /**
   * The parameters' JSON Schema as given (an MCP server's `inputSchema`), rendered as is in place of the one
   * derived from `parametersSchema`.
   */
  readonly jsonSchema?: Record<string, unknown> | undefined
}

/**
 * Any tool.
 *
 * @category models
 * @since 0.1.0
 */
export interface Any extends Tool<string, any, any, any, any> {}

/**
 * The environment services a tool (or a union of tools) needs.
 *
 * @category models
 * @since 0.1.0
 */
export type Requirements<T> = T extends Tool<infer _N, infer _P, infer _S, infer _F, infer R> ? R : never

/**
 * The identifiers of a list of service keys.
 *
 * @category models
 * @since 0.1.0
 */
export type Identifiers<Deps extends ReadonlyArray<Context.Key<any, any>>> = Context.Service.Identifier<Deps[number]>

/**
 * The OpenAI function-tool entry a chat template renders (`tools=[...]`).
 *
 * @category models
 * @since 0.1.0
 */
export interface FunctionSchema {
  readonly type: "function"
  readonly function: {
    readonly name: string
    readonly description: string
    readonly parameters: Record<string, unknown>
  }
}

/**
 * Parameters of a tool that takes none.
 *
 * @category models
 * @since 0.1.0
 */
export const EmptyParams = Schema.Struct({})

/**
 * The options of {@link make}.
 *
 * @category models
 * @since 0.1.0
 */
export interface Options<
  Params extends Schema.Top,
  Success extends Schema.Top,
  Failure extends Schema.Top,
  Deps extends ReadonlyArray<Context.Key<any, any>>
> {
  readonly description: string
  readonly parameters?: Params | undefined
  readonly success?: Success | undefined
  readonly failure?: Failure | undefined
  readonly failureMode?: "return" | "error" | undefined
  readonly dependencies?: Deps | undefined
  readonly terminal?: boolean | undefined
  readonly strict?: boolean | undefined
  readonly timeout?: Duration.Input | undefined
  readonly concurrency?: number | undefined
  readonly retry?: RetryPolicy | undefined
  readonly maxOutput?: OutputBudget | undefined
  readonly render?: ((value: Success["Type"]) => string | ReadonlyArray<Message.ContentPart>) | undefined
  /** The parameters' JSON Schema shown to the model, when it comes from elsewhere (an MCP server's tool list). */
  readonly jsonSchema?: Record<string, unknown> | undefined
  readonly handler: (
    params: Params["Type"],
    context: HandlerContext
  ) => Effect.Effect<Success["Type"], Failure["Type"], Identifiers<Deps>>
}

// ===== Errors =====

/**
 * The arguments are not JSON or do not match the parameter Schema (or, when a tool actor is made, a tool's name
 * is taken or its parameters have no JSON form).
 *
 * @category errors
 * @since 0.1.0
 */
export class DecodeError extends Schema.TaggedError<DecodeError>()("DecodeError", { message: Schema.String }) {}

/**
 * No tool has that name.
 *
 * @category errors
 * @since 0.1.0
 */
export class UnknownTool extends Schema.TaggedError<UnknownTool>()("UnknownTool", { message: Schema.String }) {}

/**
 * The handler did not finish within the tool's timeout (after any retries).
 *
 * @category errors
 * @since 0.1.0
 */
export class Timeout extends Schema.TaggedError<Timeout>()("Timeout", {
  message: Schema.String,
  /** The tool's timeout. */
  timeoutMs: Schema.Number
}) {}

/**
 * The handler failed with a typed failure (`cause`).
 *
 * @category errors
 * @since 0.1.0
 */
export class HandlerFailure extends Schema.TaggedError<HandlerFailure>()("HandlerFailure", {
  message: Schema.String,
  /** Set when the handler's failure declared itself retryable. */
  retryable: Schema.optionalKey(Schema.Boolean),
  /** The handler's failure. */
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The handler's value does not match the success Schema, or cannot be rendered.
 *
 * @category errors
 * @since 0.1.0
 */
export class InvalidResult extends Schema.TaggedError<InvalidResult>()("InvalidResult", {
  message: Schema.String
}) {}

/**
 * The handler threw or died (a bug in the tool); the model sees a generic message, `cause` holds the defect.
 *
 * @category errors
 * @since 0.1.0
 */
export class Defect extends Schema.TaggedError<Defect>()("Defect", {
  message: Schema.String,
  cause: Schema.optionalKey(Schema.Defect())
}) {}

/**
 * The chain did not provide a service the tool declared (a wiring bug, not the model's).
 *
 * @category errors
 * @since 0.1.0
 */
export class MissingEnvironment extends Schema.TaggedError<MissingEnvironment>()("MissingEnvironment", {
  message: Schema.String,
  /** The key of the service the chain did not provide. */
  service: Schema.String
}) {}

/**
 * Why a tool call failed.
 *
 * @category errors
 * @since 0.1.0
 */
export const ToolErrorReason = Schema.Union([
  DecodeError,
  UnknownTool,
  Timeout,
  HandlerFailure,
  InvalidResult,
  Defect,
  MissingEnvironment
])
export type ToolErrorReason = typeof ToolErrorReason.Type

/**
 * A failed tool call. `message` is the text the model observes (the reason's). Handle reasons with
 * `Effect.catchReason("ToolError", "HandlerFailure", …)`.
 *
 * @category errors
 * @since 0.1.0
 */
export class ToolError extends Schema.TaggedError<ToolError>()("ToolError", {
  tool: Schema.String,
  toolCallId: Schema.String,
  reason: ToolErrorReason
}) {
  get isRetryable(): boolean {
    return this.reason._tag === "Timeout" || (this.reason._tag === "HandlerFailure" && this.reason.retryable === true)
  }
  /** The model's fault (a malformed call), as opposed to a failure at run time. */
  get isFormatError(): boolean {
    return this.reason._tag === "DecodeError" || this.reason._tag === "UnknownTool"
  }
  override get message(): string {
    return this.reason.message
  }
}

/** Each reason's class by its tag, for `toolError`; a reason left out is a compile error. */
const reasons = {
  DecodeError,
  UnknownTool,
  Timeout,
  HandlerFailure,
  InvalidResult,
  Defect,
  MissingEnvironment
} satisfies Record<ToolErrorReason["_tag"], unknown>

/**
 * The facts a reason carries besides its message (`timeoutMs` of `Timeout`, `service` of `MissingEnvironment`).
 *
 * @category errors
 * @since 0.1.0
 */
export type ToolErrorFacts<Tag extends ToolErrorReason["_tag"]> = Omit<
  ConstructorParameters<(typeof reasons)[Tag]>[0],
  "message"
>

/**
 * A `ToolError` of the call `toolCallId` to `tool`, for the reason tagged `tag`:
 * `toolError("search", id, "Timeout", text, { timeoutMs })`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const toolError = <Tag extends ToolErrorReason["_tag"]>(
  tool: string,
  toolCallId: string,
  tag: Tag,
  message: string,
  ...[facts]: {} extends ToolErrorFacts<Tag> ? [facts?: ToolErrorFacts<Tag>] : [facts: ToolErrorFacts<Tag>]
): ToolError => {
  const Reason = reasons[tag] as new(fields: { readonly message: string }) => ToolErrorReason
  return new ToolError({ tool, toolCallId, reason: new Reason({ ...facts, message }) })
}

// ===== Constructors =====

const defaultRender = (encoded: unknown): string =>
  typeof encoded === "string" ? encoded : encoded === undefined ? "" : JSON.stringify(encoded)

/**
 * Defines a tool.
 *
 * **Example** (A stateless tool)
 *
 * ```ts
 * const Add = Tool.make("add", {
 *   description: "Add two numbers",
 *   parameters: Schema.Struct({ a: Schema.Number, b: Schema.Number }),
 *   success: Schema.Number,
 *   handler: ({ a, b }) => Effect.succeed(a + b)
 * })
 * ```
 *
 * **Gotchas**
 *
 * A handler that uses an environment service must list it in `dependencies`; the type checker enforces it and
 * the tool actor checks at run time that the chain provided it.
 *
 * @category constructors
 * @since 0.1.0
 */
export const make = <
  const Name extends string,
  Params extends Schema.Top = typeof EmptyParams,
  Success extends Schema.Top = typeof Schema.String,
  Failure extends Schema.Top = typeof Schema.Never,
  const Deps extends ReadonlyArray<Context.Key<any, any>> = []
>(
  name: Name,
  options: Options<Params, Success, Failure, Deps>
): Tool<Name, Params, Success, Failure, Identifiers<Deps>> => {
  const parametersSchema = (options.parameters ?? EmptyParams) as Params
  const successSchema = (options.success ?? Schema.String) as Success
  const failureSchema = (options.failure ?? Schema.Never) as Failure
  return {
    [TypeId]: TypeId,
    name,
    description: options.description,
    parametersSchema,
    successSchema,
    failureSchema,
    failureMode: options.failureMode ?? "return",
    dependencies: options.dependencies ?? [],
    terminal: options.terminal ?? false,
    strict: options.strict ?? true,
    timeout: options.timeout === undefined ? undefined : Duration.fromInputUnsafe(options.timeout),
    concurrency: options.concurrency,
    retry: options.retry,
    maxOutput: options.maxOutput,
    render: options.render,
    ...(options.jsonSchema === undefined ? {} : { jsonSchema: options.jsonSchema }),
    handler: options.handler,
    definition: AiTool.make(name, {
      description: options.description,
      parameters: parametersSchema as any,
      success: successSchema as any,
      failure: failureSchema as any,
      failureMode: options.failureMode ?? "return"
    })
  }
}

/**
 * Makes a tool from an `effect/ai` tool definition (`Tool.make` from `effect/ai`) and a handler: name,
 * description, Schemas and failure mode come from the definition. `effect/ai` does not keep a tool's
 * `dependencies` at run time, so list them again here.
 *
 * **Example** (Reusing an `effect/ai` definition)
 *
 * ```ts
 * const Search = AiTool.make("search", { description: "Search", parameters: Schema.Struct({ q: Schema.String }),
 *   success: Schema.String, failureMode: "return" })
 * const search = Tool.fromAi(Search, { handler: ({ q }) => Effect.succeed(`results for ${q}`) })
 * ```
 *
 * @category constructors
 * @since 0.1.0
 */
export const fromAi = <
  const Name extends string,
  Config extends {
    readonly parameters: Schema.Top
    readonly success: Schema.Top
    readonly failure: Schema.Top
    readonly failureMode: "error" | "return"
  },
  const Deps extends ReadonlyArray<Context.Key<any, any>> = []
>(
  definition: AiTool.Tool<Name, Config, any>,
  options:
    & Omit<
      Options<Config["parameters"], Config["success"], Config["failure"], Deps>,
      "description" | "parameters" | "success" | "failure" | "failureMode"
    >
    & { readonly description?: string | undefined }
): Tool<Name, Config["parameters"], Config["success"], Config["failure"], Identifiers<Deps>> =>
  make(definition.name, {
    ...options,
    description: options.description ?? AiTool.getDescription(definition as AiTool.Any) ?? "",
    parameters: definition.parametersSchema,
    success: definition.successSchema,
    failure: definition.failureSchema,
    failureMode: definition.failureMode
  }) as Tool<Name, Config["parameters"], Config["success"], Config["failure"], Identifiers<Deps>>

/**
 * The spec of one method exposed by {@link methods}.
 *
 * @category models
 * @since 0.1.0
 */
export interface MethodSpec<S, Params extends Schema.Top, Success extends Schema.Top, Failure extends Schema.Top>
  extends Omit<Options<Params, Success, Failure, []>, "handler" | "dependencies">
{
  /** How to call the method (default: `instance[method](params)`, which may return an Effect or a value). */
  readonly call?: ((instance: S, params: Params["Type"]) => Effect.Effect<Success["Type"], Failure["Type"]>) | undefined
}

/**
 * Exposes methods of an environment service as tools bound to the chain's instance: each call looks up the
 * service in the chain's context (one instance per chain with `Environment.perChain`) and invokes the method on
 * it. Tool names are the method names.
 *
 * **Example** (A class-based environment)
 *
 * ```ts
 * class Counter { n = 0; add({ by }: { by: number }) { return (this.n += by) } }
 * class CounterEnv extends Context.Service<CounterEnv, Counter>()("CounterEnv") {}
 * const [add] = Tool.methods(CounterEnv, {
 *   add: { description: "Add to the counter", parameters: Schema.Struct({ by: Schema.Int }), success: Schema.Int }
 * })
 * ```
 *
 * @category constructors
 * @since 0.1.0
 */
export const methods = <
  I,
  S,
  const Specs extends { readonly [K in keyof S & string]?: MethodSpec<S, any, any, any> }
>(
  service: Context.Key<I, S>,
  specs: Specs
): ReadonlyArray<Tool<string, Schema.Top, Schema.Top, Schema.Top, I>> =>
  Object.entries(specs).flatMap(([method, spec]) => {
    if (spec === undefined) return []
    const { call, ...options } = spec as MethodSpec<S, Schema.Top, Schema.Top, Schema.Top>
    const invoke = call ?? ((instance: S, params: unknown) =>
      Effect.suspend(() => {
        const out = (instance as any)[method](params)
          return (Effect.isEffect(out) ? out : Effect.succeed(out)) as Effect.Effect<unknown, unknown>
      }))
    return [make(method, {
      ...options,
      dependencies: [service],
      handler: (params) => Effect.flatMap(Effect.service(service), (instance) => invoke(instance, params))
    }) as Tool<string, Schema.Top, Schema.Top, Schema.Top, I>]
  })

// ===== Arguments =====

/**
 * The codec a call's JSON arguments are decoded with: the parameters' canonical JSON codec
 * (`Schema.toCodecJson`), the one whose JSON Schema the model is shown (`effect/ai` renders
 * `Schema.toJsonSchemaDocument`, which describes that codec). So a `Schema.Date` field takes the ISO string its JSON
 * Schema asks for, `Schema.BigInt` a string of digits, an optional field `null`, a class its encoded fields; the
 * handler gets the decoded values (a `Date`, a `bigint`, an instance).
 *
 * **Gotchas**
 *
 * Decoding with `parametersSchema` itself (as `effect/ai`'s `LanguageModel` does) refuses what the prompt's JSON
 * Schema allows: a `Date` field wants a `Date` instance, which no JSON argument is.
 *
 * @category getters
 * @since 0.1.0
 */
export const argumentsCodec = (tool: Any): Schema.Codec<unknown, unknown> =>
  Schema.toCodecJson(tool.parametersSchema as Schema.Top) as unknown as Schema.Codec<unknown, unknown>

/** Where a field path is shown (`["when"]`, `["dates"][number]`); the parameters themselves are `(parameters)`. */
const fieldPath = (path: ReadonlyArray<string>): string => (path.length === 0 ? "(parameters)" : path.join(""))

/**
 * The first part of an encoded AST that no JSON value decodes to: a declaration without a JSON codec, or a symbol
 * key (JSON keys are strings).
 */
const opaquePart = (
  ast: SchemaAST.AST,
  path: ReadonlyArray<string>,
  seen: Set<SchemaAST.AST>
): { readonly path: ReadonlyArray<string>; readonly why: string } | undefined => {
  if (seen.has(ast)) return undefined
  seen.add(ast)
  const first = (parts: ReadonlyArray<readonly [SchemaAST.AST, ReadonlyArray<string>]>) => {
    for (const [part, at] of parts) {
      const found = opaquePart(part, at, seen)
      if (found !== undefined) return found
    }
    return undefined
  }
  switch (ast._tag) {
    case "Declaration": {
      const codec = ast.annotations?.toCodecJson ?? ast.annotations?.toCodec
      if (typeof codec !== "function") {
        return {
          path,
          why: "is a declaration with no JSON form (Schema.declare or Schema.instanceOf without a toCodecJson " +
            "annotation); give it one, or use a Schema that has one (Schema.Date, a Schema.Class, a transformation " +
            "from a JSON type)"
        }
      }
      return first(ast.typeParameters.map((tp) => [tp, path] as const))
    }
    case "Objects": {
      const symbol = ast.propertySignatures.find((ps) => typeof ps.name !== "string")
      if (symbol !== undefined) {
        return { path: [...path, `[${String(symbol.name)}]`], why: "is keyed by a symbol, which JSON cannot write" }
      }
      return first([
        ...ast.propertySignatures.map((ps) => [ps.type, [...path, `[${JSON.stringify(ps.name)}]`]] as const),
        ...ast.indexSignatures.map((is) => [is.type, [...path, "[string]"]] as const)
      ])
    }
    case "Arrays":
      return first([
        ...ast.elements.map((e, i) => [e, [...path, `[${i}]`]] as const),
        ...ast.rest.map((r) => [r, [...path, "[number]"]] as const)
      ])
    case "Union":
      return first(ast.types.map((t) => [t, path] as const))
    case "Suspend":
      return opaquePart(ast.thunk(), path, seen)
    default:
      return undefined
  }
}

/**
 * Why a tool's parameters cannot be read from the JSON arguments a model writes, naming the field, or undefined
 * when they can (see {@link argumentsCodec}). A declaration without a JSON codec (`Schema.instanceOf(Foo)`, a bare
 * `Schema.declare`) renders as `{}` in the prompt ("anything") yet no JSON value decodes to it, and a symbol key
 * cannot be written in JSON: a tool with either could never be called. `ToolActor.make` refuses such a tool
 * (`ToolError`, reason `DecodeError`), so a task holding one fails before any rollout.
 *
 * @category getters
 * @since 0.1.0
 */
export const jsonProblem = (tool: Any): string | undefined => {
  const found = opaquePart(SchemaAST.toEncoded((tool.parametersSchema as Schema.Top).ast), [], new Set())
  return found === undefined
    ? undefined
    : `tool "${tool.name}" can never be called: no JSON arguments decode to its parameter field ` +
      `${fieldPath(found.path)}, which ${found.why}`
}

/**
 * Why `args` would be refused as the arguments of a call to `tool` (decoded as the tool actor decodes them, with
 * {@link argumentsCodec}: strict tools refuse unknown keys), or undefined when they would be taken. For checking
 * demonstrations before training.
 *
 * @category getters
 * @since 0.1.0
 */
export const argumentsProblem = (tool: Any, args: unknown): string | undefined => {
  const problem = jsonProblem(tool)
  if (problem !== undefined) return problem
  const decoded = Schema.decodeUnknownExit(argumentsCodec(tool))(
    args,
    tool.strict ? { onExcessProperty: "error", errors: "all" } : { errors: "all" }
  )
  if (Exit.isSuccess(decoded)) return undefined
  return Option.match(Cause.findErrorOption(decoded.cause), {
    onNone: () => "invalid arguments",
    // One issue a line, its path indented below it: `Missing key at ["n"]; Expected number at ["i"]`.
    onSome: (e) => e.message.replace(/\n\s+/g, " ").replace(/\n/g, "; ")
  })
}

// ===== JSON Schema =====

/**
 * The parameters of a tool as JSON Schema (via `effect/ai`'s rendering), or its `jsonSchema` when it has one (an
 * MCP tool's `inputSchema`, as its server wrote it). Strict tools say `additionalProperties: false`.
 *
 * @category getters
 * @since 0.1.0
 */
export const parametersJsonSchema = (tool: Any): Record<string, unknown> => {
  if (tool.jsonSchema !== undefined) return tool.jsonSchema
  const fields = (tool.parametersSchema as { readonly fields?: object }).fields
  // An empty Struct renders as "any non-null value"; chat templates expect an object with no properties.
  const schema = fields !== undefined && Object.keys(fields).length === 0
    ? { type: "object" } as Record<string, unknown>
    : { ...AiTool.getJsonSchema(tool.definition) } as Record<string, unknown>
  if (tool.strict && schema.type === "object") schema.additionalProperties = false
  if (schema.type === "object" && schema.properties === undefined) schema.properties = {}
  return schema
}

/**
 * A tool as the OpenAI function-tool entry chat templates render.
 *
 * @category getters
 * @since 0.1.0
 */
export const functionSchema = (tool: Any): FunctionSchema => ({
  type: "function",
  function: { name: tool.name, description: tool.description, parameters: parametersJsonSchema(tool) }
})

// ===== Observations =====

/**
 * The observation text of a failed call. The texts of format errors have fixed prefixes (see
 * {@link formatErrorOf}).
 *
 * @category getters
 * @since 0.1.0
 */
export const errorText = (
  reason: ToolErrorReason["_tag"],
  tool: string,
  detail: string
): string => {
  switch (reason) {
    case "DecodeError":
      return `Error: invalid arguments for tool "${tool}": ${detail}`
    case "UnknownTool":
      return `Error: unknown tool "${tool}". ${detail}`
    case "Timeout":
      return `Error: tool "${tool}" timed out after ${detail}.`
    case "HandlerFailure":
      return `Error: ${detail}`
    case "InvalidResult":
      return `Error: tool "${tool}" returned an invalid result.`
    case "Defect":
      return `Error: tool "${tool}" failed with an internal error.`
    case "MissingEnvironment":
      return `Error: tool "${tool}" is not available in this episode (${detail}).`
  }
}

const formatPrefixes: ReadonlyArray<readonly [RegExp, ToolErrorReason["_tag"]]> = [
  [/^Error: invalid arguments for tool "/, "DecodeError"],
  [/^Error: unknown tool "/, "UnknownTool"]
]

/**
 * The format-error reason of an error observation (bad arguments, unknown tool), or undefined for any other
 * text. Tool messages are written only by the runtime, so the prefixes are unambiguous.
 *
 * @category getters
 * @since 0.1.0
 */
export const formatErrorOf = (observation: string): ToolErrorReason["_tag"] | undefined =>
  formatPrefixes.find(([re]) => re.test(observation))?.[1]

/**
 * Renders an encoded success value as text.
 *
 * @category getters
 * @since 0.1.0
 */
export const renderValue = defaultRender

// ===== Truncation =====

/**
 * The part of a tokenizer truncation needs (adapt `@huggingface/tokenizers`' `Tokenizer` with
 * `{ encode: (t) => tok.encode(t, { add_special_tokens: false }).ids, decode: (ids) => tok.decode(ids) }`).
 *
 * @category models
 * @since 0.1.0
 */
export interface TokenCodec {
  readonly encode: (text: string) => ReadonlyArray<number>
  readonly decode: (ids: ReadonlyArray<number>) => string
}

/**
 * The marker that ends a truncated observation.
 *
 * @category getters
 * @since 0.1.0
 */
export const truncationMarker = (dropped: number, unit: "characters" | "tokens"): string =>
  `\n[... truncated: ${dropped} more ${unit}]`

/** A character marker written upstream (a sandbox cutting its output first, in the same words). */
const upstreamMarker = /\n\[\.\.\. truncated: (\d+) more characters\]/g

/** The characters of the original that `text` stands for: its own, with each upstream marker read as what it cut. */
const originalLength = (text: string): number => {
  let n = text.length
  for (const m of text.matchAll(upstreamMarker)) n += Number(m[1]) - m[0].length
  return n
}

/** Cuts `text` to `keep` UTF-16 units without splitting a surrogate pair. */
const cutChars = (text: string, keep: number): string => {
  const code = text.charCodeAt(keep - 1)
  return text.slice(0, code >= 0xd800 && code <= 0xdbff ? keep - 1 : keep)
}

/**
 * Truncates an observation to a budget of characters and/or tokens. The result, marker included, fits the
 * budget; it ends with {@link truncationMarker} exactly when something was cut. The character count includes what an
 * upstream cut in the dropped part had already removed (a sandbox that truncated its output with the same marker):
 * the policy is told how much of the original it does not see.
 *
 * @category combinators
 * @since 0.1.0
 */
export const truncate = (
  text: string,
  budget: OutputBudget,
  tokenizer?: TokenCodec
): { readonly text: string; readonly truncated: boolean } => {
  let out = text
  let truncated = false
  if (budget.chars !== undefined && out.length > budget.chars) {
    // The whole text's original length bounds the count, so the marker's room is never short of its digits.
    const room = Math.max(0, budget.chars - truncationMarker(originalLength(out), "characters").length)
    const head = cutChars(out, room)
    out = head + truncationMarker(originalLength(out.slice(head.length)), "characters")
    if (out.length > budget.chars) out = out.slice(0, budget.chars) // budget smaller than the marker itself
    truncated = true
  }
  if (budget.tokens !== undefined && tokenizer !== undefined) {
    const ids = tokenizer.encode(out)
    if (ids.length > budget.tokens) {
      const marker = truncationMarker(ids.length, "tokens")
      let keep = Math.max(0, budget.tokens - tokenizer.encode(marker).length)
      // Re-encoding a decoded prefix can merge differently; shrink by the overflow until the whole text fits.
      for (;;) {
        const candidate = tokenizer.decode(ids.slice(0, keep)) + truncationMarker(ids.length - keep, "tokens")
        const overflow = tokenizer.encode(candidate).length - budget.tokens
        if (keep === 0 || overflow <= 0) {
          out = candidate
          break
        }
        keep = Math.max(0, keep - overflow)
      }
      truncated = true
    }
  }
  return { text: out, truncated }
}
