// An agent function of the gateway's tasks.
import * as AgentTask from "../../../src/AgentTask.ts"
declare const agent: Parameters<typeof AgentTask.make>[1]["agent"]
