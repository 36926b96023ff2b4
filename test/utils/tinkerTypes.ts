/**
 * Stand-ins for the API's Schemas until `src/tinker/` (branch tinkerwire) is merged: only the fields these tests use.
 */
import { Schema } from "effect"

export const ForwardBackwardInput = Schema.Struct({ model_id: Schema.String, loss_fn: Schema.String })
export const ForwardBackwardOutput = Schema.Struct({
  loss_fn_outputs: Schema.Array(Schema.Unknown),
  metrics: Schema.Record(Schema.String, Schema.Number)
})
export const envelopes = {
  UntypedAPIFuture: Schema.Struct({ request_id: Schema.String, model_id: Schema.optionalKey(Schema.String) }),
  RequestFailedResponse: Schema.Struct({ error: Schema.String, category: Schema.String })
}
