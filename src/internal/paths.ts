/**
 * Whether a path stays inside a root. A path another party names (a dataset row's folder, a file a task folder
 * holds) is resolved — lexically for `..` and absolute paths, through `realpath` for symbolic links — and compared
 * with the root's own resolved path, so that `../x`, `/etc` and a link to either are told from a path that stays.
 */
import { isAbsolute, relative } from "node:path"

/**
 * Whether `path` is `root` or below it. Both must be absolute and normalised (as `path.resolve` or `realpath`
 * return them): the comparison is of path segments, so `/data/tasks-old` is not inside `/data/tasks`.
 */
export const isWithin = (root: string, path: string): boolean => {
  const rel = relative(root, path)
  return rel === "" || (rel !== ".." && !rel.startsWith("../") && !isAbsolute(rel))
}
