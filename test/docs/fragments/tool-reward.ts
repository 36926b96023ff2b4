import { Effect, Schema } from "effect"
import { Reward, Tool } from "../../../src/index.ts"
