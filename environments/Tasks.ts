/**
 * The built-in tasks a config can name (`"task": "calculator"`). A user's own task is a module path instead
 * (`"task": "./my-task.ts"`), or the module given to `agentfly train` itself.
 *
 * @since 0.1.0
 */
import type * as Task from "../src/Task.ts"
import * as CalculatorTask from "./calculator/CalculatorTask.ts"
import * as HouseholdTask from "./household/HouseholdTask.ts"
import * as SearchTask from "./search/SearchTask.ts"
import * as WebShopTask from "./webshop/WebShopTask.ts"

/**
 * Built-in tasks by name.
 *
 * @category constants
 * @since 0.1.0
 */
export const builtins: Readonly<Record<string, Task.Definition>> = {
  calculator: CalculatorTask.task,
  household: HouseholdTask.household,
  science: HouseholdTask.science,
  search: SearchTask.task,
  webshop: WebShopTask.task
}
