/**
 * A container's network allow-list: the hosts (IPv4 addresses or names, as Harbor's `allowed_hosts`) a container
 * started without a network (`NetworkMode: "none"`: loopback only) may reach, and nothing else.
 *
 * After the container starts, a veth pair joins its network namespace to the host's: the container's end gets one
 * address of its own (`10.252.x.y/32`, from its id) and a route per allowed host, nothing more (no default route,
 * no subnet); the host's end routes that address back. The host answers for its own addresses, so an allowed
 * address that is the host's (a package mirror or proxy the user runs there) is reached directly; anything else is
 * "network unreachable" inside the container, which cannot add routes (every capability is dropped). The pair lives
 * in the container's namespace: removing the container removes it.
 *
 * Needs `ip` (iproute2) and `nsenter` on the host and the right to use them (root, as the engine's own user);
 * without an allow-list none of this runs.
 */
import { Effect } from "effect"
import { execFile } from "node:child_process"
import { createHash } from "node:crypto"
import { lookup } from "node:dns/promises"
import { isIPv4 } from "node:net"

/** `cmd args…` on the host; fails with its stderr. */
const run = (cmd: string, args: ReadonlyArray<string>) =>
  Effect.callback<void, Error>((resume) => {
    execFile(cmd, [...args], { timeout: 10_000 }, (error, _stdout, stderr) => {
      if (error === null) resume(Effect.void)
      else resume(Effect.fail(new Error(`${cmd} ${args.join(" ")}: ${String(stderr).trim() || error.message}`)))
    })
  })

/** The IPv4 addresses of the allow-list's entries (names looked up once, at the container's start). */
export const resolveHosts = (hosts: ReadonlyArray<string>): Effect.Effect<ReadonlyArray<string>, Error> =>
  Effect.forEach(hosts, (host) =>
    isIPv4(host)
      ? Effect.succeed([host])
      : Effect.tryPromise({
        try: () => lookup(host, { all: true, family: 4 }).then((found) => found.map((a) => a.address)),
        catch: (e) => new Error(`the allowed host ${host} cannot be resolved: ${e instanceof Error ? e.message : e}`)
      })).pipe(Effect.map((lists) => [...new Set(lists.flat())]))

/** The names and the container's address of a container's link, from its id. */
export const linkOf = (containerId: string) => {
  const h = createHash("sha256").update(containerId).digest()
  const tag = containerId.slice(0, 10)
  return { host: `afh${tag}`, peer: `afc${tag}`, address: `10.252.${h[0]!}.${1 + (h[1]! % 254)}` }
}

/**
 * Joins the network namespace of the process `pid` (a container's main process) to the host's, with routes to the
 * allowed `hosts` (IPv4) only.
 *
 * @category constructors
 * @since 0.1.0
 */
export const attach = (
  pid: number,
  containerId: string,
  hosts: ReadonlyArray<string>
): Effect.Effect<void, Error> => {
  const link = linkOf(containerId)
  const inside = (args: ReadonlyArray<string>) => run("nsenter", ["-t", String(pid), "-n", "ip", ...args])
  return Effect.gen(function*() {
    yield* run("ip", ["link", "add", link.host, "type", "veth", "peer", "name", link.peer, "netns", String(pid)])
    yield* run("ip", ["link", "set", link.host, "up"])
    yield* run("ip", ["route", "add", `${link.address}/32`, "dev", link.host])
    yield* inside(["addr", "add", `${link.address}/32`, "dev", link.peer])
    yield* inside(["link", "set", link.peer, "up"])
    for (const host of hosts) yield* inside(["route", "add", `${host}/32`, "dev", link.peer])
  })
}
