/**
 * A stateful MCP server as an environment: one server process (or HTTP session) per chain, leased through the
 * resource manager like a container, and reset between chains.
 *
 * - **Start**: `McpTools.connect` for the instance (its own process over stdio; its transport may depend on the
 *   instance id: a state file of its own). Closing the instance's scope ends the process: nothing outlives the pool.
 * - **Reset**: with a `reset` (truncate the server's state file, call a tool that clears it), the process is kept
 *   and reset when its chain releases it; without one, the spec's policy is `recreate`: the process is ended and the
 *   next chain gets a fresh one. Either way no chain sees another's state.
 * - **Crashes**: a call whose connection closed (the process died mid-call) is `EnvError(Crashed)`: the manager
 *   replaces the process for the chain, and the model reads the crash as the call's observation (the tool actor's
 *   `HandlerFailure`, retryable). The health check is an MCP `ping`.
 *
 * **Example** (the reference memory server, one knowledge graph per chain)
 *
 * ```ts
 * const memory = McpTools.stdio("memory", (id) => ({
 *   command: "mcp-server-memory", env: { MEMORY_FILE_PATH: `${dir}/${id}.jsonl` }
 * }))
 * const resource = Mcp.resource(memory, { pool: { max: 8 }, reset: () => removeFile(`${dir}/…`) })
 * const task = Effect.map(McpTools.tools(memory), (tools) => Task.make("notes", {
 *   tools, environment: Mcp.provider(resource), layer: ResourceManager.layer, …
 * }))
 * ```
 *
 * @since 0.1.0
 */
import { Context, Effect } from "effect"
import type { Scope } from "effect"
import * as Environment from "../../src/Environment.ts"
import * as Resource from "../../src/Resource.ts"
import * as McpTools from "../McpTools.ts"
import * as ResourceManager from "../ResourceManager.ts"

/**
 * A leased server instance: its connection and the id it was started with.
 *
 * @category models
 * @since 0.1.0
 */
export interface Instance {
  readonly id: string
  readonly connection: McpTools.Connection
}

/**
 * Options of {@link resource}: the pool's sizing and time limits, who shares an instance (default: each chain its
 * own), and how to reset one for the next chain (default: none, so a released process is ended).
 *
 * @category models
 * @since 0.1.0
 */
export interface Options {
  readonly pool?: Partial<Resource.PoolSize> | undefined
  readonly timeouts?: Partial<Resource.Timeouts> | undefined
  readonly scope?: Resource.SharingScope | undefined
  readonly reset?: ((instance: Instance) => Effect.Effect<void, Environment.EnvError>) | undefined
  readonly healthCheckOnAcquire?: boolean | undefined
}

const asEnvError = (server: McpTools.Server, method: string) => (e: McpTools.McpError): Environment.EnvError =>
  e.reason._tag === "Closed"
    ? Environment.envError(server.name, method, "Crashed", `the MCP server ${server.name} exited: ${e.message}`)
    : e.reason._tag === "ConnectFailed"
    ? Environment.envError(server.name, method, "Unavailable", e.message, { cause: e })
    : e.reason._tag === "Timeout"
    ? Environment.envError(server.name, method, "Timeout", e.message, { timeoutMs: e.reason.timeoutMs })
    : Environment.envError(server.name, method, "InvalidAction", e.message)

/**
 * The launcher of a server's instances: `start` connects (starting the process), `health` pings, `reset` is the
 * given one.
 *
 * @category constructors
 * @since 0.1.0
 */
export const launcher = (
  server: McpTools.Server,
  reset?: (instance: Instance) => Effect.Effect<void, Environment.EnvError>
): Resource.Launcher<Instance> => ({
  start: (
    _spec: Resource.ResourceSpec,
    instanceId: string
  ): Effect.Effect<Instance, Environment.EnvError, Scope.Scope> =>
    Effect.map(
      Effect.mapError(McpTools.connect(server, instanceId), asEnvError(server, "start")),
      (connection) => ({ id: instanceId, connection })
    ),
  reset: reset ?? (() => Effect.fail(Environment.envError(server.name, "reset", "ResetFailed", "no reset given"))),
  health: (instance) =>
    instance.connection.isClosed()
      ? Effect.fail(Environment.envError(server.name, "health", "Crashed", `the MCP server ${server.name} exited`))
      : Effect.mapError(instance.connection.ping, asEnvError(server, "health"))
})

/**
 * The resource of a server: a spec of kind `process` named after it (per-chain instances by default; `recreate`
 * unless a `reset` is given) and its launcher.
 *
 * @category constructors
 * @since 0.1.0
 */
export const resource = (server: McpTools.Server, options: Options = {}): Resource.Resource<Instance> =>
  Resource.resource(
    Resource.makeUnsafe({
      name: `mcp-${server.name}`,
      kind: "process",
      factory: server.name,
      ...(options.pool === undefined ? {} : { pool: options.pool }),
      ...(options.timeouts === undefined ? {} : { timeouts: options.timeouts }),
      scope: options.scope ?? "chain",
      resetPolicy: options.reset === undefined ? "recreate" : "reset",
      healthCheckOnAcquire: options.healthCheckOnAcquire ?? false
    }),
    launcher(server, options.reset)
  )

/**
 * The session a chain's tools call, over its lease: every call goes through `lease.use`, so that a process that
 * died is replaced for the chain (its call fails once with `EnvError(Crashed)`).
 *
 * @category constructors
 * @since 0.1.0
 */
export const leasedSession = (
  server: McpTools.Server,
  lease: ResourceManager.Lease<Instance>
): McpTools.Session => ({
  server: server.name,
  callTool: (name, args) =>
    lease.use((instance) =>
      Effect.catchIf(
        instance.connection.callTool(name, args),
        (e) => e.reason._tag === "Closed",
        (e) => Effect.fail(asEnvError(server, name)(e))
      )
    )
})

/**
 * The environment provider of a server's resource: each chain leases its instance from the `ResourceManager` and
 * gets the server's {@link McpTools.Session} over that lease.
 *
 * @category constructors
 * @since 0.1.0
 */
export const provider = (
  server: McpTools.Server,
  options: Options = {}
): Effect.Effect<Environment.Provider<McpTools.Session, Resource.LeaseError>, never, ResourceManager.ResourceManager> =>
  ResourceManager.provider(
    resource(server, options),
    (lease) => Effect.succeed(Context.make(server.key, leasedSession(server, lease)))
  )
