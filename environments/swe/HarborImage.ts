/**
 * The image of a Harbor task: `[environment] docker_image` (the engine's, else pulled) or `environment/` built by
 * the engine's builder once per machine (tagged by the digest of its files) within `build_timeout_sec`; with a
 * run's `bake`, a root layer over it; and the user and working directory its containers get (the task's, else the
 * image's `USER` and `WORKDIR`). An image that cannot be had fails with its name and the engine's reason.
 *
 * @since 0.1.0
 */
import { Effect } from "effect"
import { createHash } from "node:crypto"
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import * as Docker from "../../actors/resources/Docker.ts"
import * as Environment from "../../src/Environment.ts"
import type * as HarborTask from "./HarborTask.ts"

const building = new Map<string, Promise<void>>()

/**
 * Why a task's image cannot be had: its name and the engine's reason.
 *
 * @category errors
 * @since 0.1.0
 */
export const imageError = (task: HarborTask.HarborTask, image: string, reason: string) =>
  Environment.envError(`harbor:${task.name}`, "build", "Unavailable", `the image ${image} cannot be had: ${reason}`)

/** Follows a build or pull stream to its end; its first error rejects. */
const follow = (docker: Docker.DockerEngine["Service"]["docker"], stream: NodeJS.ReadableStream) =>
  new Promise<void>((done, reject) =>
    docker.modem.followProgress(stream, (error, output: Array<{ error?: string; errorDetail?: unknown }>) => {
      const failed = output?.find((o) => o.error !== undefined)
      if (error !== null || failed !== undefined) reject(new Error(String(failed?.error ?? error)))
      else done()
    })
  )

/** `promise`, or a rejection after `millis`. */
const within = <A>(promise: Promise<A>, millis: number, what: string) =>
  Promise.race([
    promise,
    new Promise<never>((_, reject) =>
      setTimeout(() => reject(new Error(`${what} took over ${millis / 1000} s`)), millis).unref()
    )
  ])

/**
 * The image of a task's environment: `[environment] docker_image` (local, else pulled), or `environment/` built once
 * per digest within the build timeout (concurrent chains wait for one build). Fails with the image's name and the
 * reason ({@link imageError}).
 *
 * @category constructors
 * @since 0.1.0
 */
export const image = (task: HarborTask.HarborTask): Effect.Effect<string, Environment.EnvError, Docker.DockerEngine> =>
  Effect.flatMap(Docker.DockerEngine, ({ docker }) => {
    const prebuilt = task.dockerImage !== undefined && task.environment.length === 0
    const tag = prebuilt ? task.dockerImage! : `agentfly-harbor/${task.digest}:1`
    const build = async () => {
      const exists = await docker.getImage(tag).inspect().then(() => true, () => false)
      if (exists) return
      if (prebuilt) return within(follow(docker, await docker.pull(tag)), task.buildTimeoutMillis, "the pull")
      const stream = await docker.buildImage(
        { context: `${task.folder}/environment`, src: [...task.environment] },
        { t: tag, rm: true, forcerm: true }
      )
      await within(follow(docker, stream), task.buildTimeoutMillis, "the build")
    }
    return Effect.tryPromise({
      try: () => {
        let pending = building.get(tag)
        if (pending === undefined) {
          pending = build()
          building.set(tag, pending)
          pending.catch(() => building.delete(tag))
        }
        return pending
      },
      catch: (e) =>
        imageError(
          task,
          prebuilt ? tag : `${tag} (built from ${task.folder}/environment)`,
          e instanceof Error ? e.message : String(e)
        )
    }).pipe(Effect.as(tag))
  })

/**
 * A task's image with `bake` (a shell command, run as root) in a layer over it: what a verifier would install at
 * verify time (`pip install pytest`, a `curl`), installed once at build time instead, so that it runs offline.
 * Built once per image and command (tagged by both), within the task's build timeout; the build's own network is the
 * engine's (none without a bridge). Fails as {@link image} does, naming the command.
 *
 * @category constructors
 * @since 0.1.0
 */
export const baked = (
  task: HarborTask.HarborTask,
  tag: string,
  bake: string
): Effect.Effect<string, Environment.EnvError, Docker.DockerEngine> =>
  Effect.flatMap(Docker.DockerEngine, ({ docker }) => {
    const derived = `agentfly-harbor/${task.digest}-baked-${
      createHash("sha256").update(`${tag}\n${bake}`).digest("hex").slice(0, 8)
    }:1`
    const build = async () => {
      const exists = await docker.getImage(derived).inspect().then(() => true, () => false)
      if (exists) return
      const context = mkdtempSync(join(tmpdir(), "agentfly-bake-"))
      try {
        const dockerfile = `FROM ${tag}\nUSER root\nRUN ${JSON.stringify(["sh", "-c", bake])}\n`
        writeFileSync(join(context, "Dockerfile"), dockerfile)
        const options = { t: derived, rm: true, forcerm: true }
        const stream = await docker.buildImage({ context, src: ["Dockerfile"] }, options)
        await within(follow(docker, stream), task.buildTimeoutMillis, "the bake")
      } finally {
        rmSync(context, { recursive: true, force: true })
      }
    }
    return Effect.tryPromise({
      try: () => {
        let pending = building.get(derived)
        if (pending === undefined) {
          pending = build()
          building.set(derived, pending)
          pending.catch(() => building.delete(derived))
        }
        return pending
      },
      catch: (e) => imageError(task, `${derived} (${tag} with bake ${JSON.stringify(bake)})`, String(e))
    }).pipe(Effect.as(derived))
  })

/**
 * The user and working directory a task's containers get: the task's (`[agent] user`, `[environment] workdir`),
 * else its image's `USER` and `WORKDIR` (root and `/` when the image sets none), as Harbor runs them.
 *
 * @category models
 * @since 0.1.0
 */
export interface Identity {
  readonly user: string
  readonly workdir: string
}

/**
 * The {@link Identity} of a task on its image.
 *
 * @category constructors
 * @since 0.1.0
 */
export const identity = (
  task: HarborTask.HarborTask,
  tag: string
): Effect.Effect<Identity, Environment.EnvError, Docker.DockerEngine> =>
  Effect.flatMap(Docker.DockerEngine, ({ docker }) =>
    Effect.tryPromise({
      try: () => docker.getImage(tag).inspect(),
      catch: (e) => imageError(task, tag, e instanceof Error ? e.message : String(e))
    }).pipe(Effect.map((info) => ({
      user: task.agentUser ?? (info.Config?.User || "0:0"),
      workdir: task.workdir ?? (info.Config?.WorkingDir || "/")
    }))))
