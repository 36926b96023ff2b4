/**
 * The built-in tasks a config can name (`"task": "calculator"`). A user's own task is a module path instead
 * (`"task": "./my-task.ts"`), or the module given to `agentfly train` itself.
 *
 * @since 0.1.0
 */
import type * as Task from "../src/Task.ts"

/**
 * Built-in tasks by name, each loaded when named: a process keeps only its own task's code (and libraries: the
 * search index, the web shop's catalogue) for its whole life.
 *
 * @category constants
 * @since 0.1.0
 */
export const builtins: Readonly<Record<string, Task.Builtin>> = {
  calculator: () => import("./calculator/CalculatorTask.ts").then((m) => m.task),
  chess: () => import("./chess/ChessTask.ts").then((m) => m.task),
  gui: () => import("./gui/GuiTask.ts").then((m) => m.task),
  household: () => import("./household/HouseholdTask.ts").then((m) => m.household),
  science: () => import("./household/HouseholdTask.ts").then((m) => m.science),
  search: () => import("./search/SearchTask.ts").then((m) => m.task),
  simuscene: () => import("./simuscene/SimuSceneTask.ts").then((m) => m.task),
  swe: () => import("./swe/SweTask.ts").then((m) => m.task),
  vqa: () => import("./vqa/VqaTask.ts").then((m) => m.task),
  webshop: () => import("./webshop/WebShopTask.ts").then((m) => m.task)
}
