/**
 * agentfly's prebuilt environments (`agentfly-ts/environments`): tools, rewards and whole tasks to reuse in tasks of
 * one's own, each module as a namespace. `Tasks.builtins` names the tasks a config can give by name
 * (`"task": "calculator"`).
 *
 * @since 0.1.0
 */
export * as Answer from "./answer/Answer.ts"
export * as Calculator from "./calculator/Calculator.ts"
export * as CalculatorTask from "./calculator/CalculatorTask.ts"
export * as ChessTask from "./chess/ChessTask.ts"
export * as HouseholdTask from "./household/HouseholdTask.ts"
export * as Judge from "./rewards/Judge.ts"
export * as MathEqual from "./math/MathEqual.ts"
export * as PythonSandbox from "./python/PythonSandbox.ts"
export * as PythonTool from "./python/PythonTool.ts"
export * as Qa from "./rewards/Qa.ts"
export * as SearchTask from "./search/SearchTask.ts"
export * as SweTask from "./swe/SweTask.ts"
export * as Tasks from "./Tasks.ts"
export * as ToolCallFormat from "./rewards/ToolCallFormat.ts"
export * as WebShopTask from "./webshop/WebShopTask.ts"
