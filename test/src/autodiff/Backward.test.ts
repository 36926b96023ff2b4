import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Autodiff from "../../../src/autodiff/Autodiff.ts"
import * as Graph from "../../../src/onnx/Graph.ts"
import { check, type Feed, noise, session } from "../../utils/gradcheck.ts"

/**
 * Every backward rule, checked against central finite differences in float64 (h = 1e-6): the worst relative error
 * max|analytic − numeric| / max|g| must be below 1e-6. The loss is Σ R ⊙ op(x…) with a fixed random R, so that
 * every element of the gradient differs.
 */
type Case = {
  readonly name: string
  readonly inputs: ReadonlyArray<
    { readonly name: string; readonly dims: ReadonlyArray<number>; readonly positive?: boolean }
  >
  readonly build: (g: Graph.Graph, xs: ReadonlyArray<string>) => string
  readonly tolerance?: number
  /** Finite-difference step (default 1e-6). */
  readonly h?: number
}

const f64 = (dims: ReadonlyArray<number>, values: ArrayLike<number>): Graph.TensorData => ({
  dtype: "float64",
  dims,
  data: Float64Array.from(values)
})
const i64 = (g: Graph.Graph, values: ReadonlyArray<number>) => g.constant(Graph.int64([values.length], values))
const scalar = (g: Graph.Graph, x: number) => g.constant(f64([], [x]))

const cases: ReadonlyArray<Case> = [
  {
    name: "Add (broadcast)",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [3] }],
    build: (g, [a, b]) => g.op("Add", [a!, b!])
  },
  {
    name: "Sub (broadcast)",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [2, 1] }],
    build: (g, [a, b]) => g.op("Sub", [a!, b!])
  },
  {
    name: "Mul (broadcast)",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [1, 3] }],
    build: (g, [a, b]) => g.op("Mul", [a!, b!])
  },
  { name: "Mul (same value twice)", inputs: [{ name: "a", dims: [4] }], build: (g, [a]) => g.op("Mul", [a!, a!]) },
  {
    name: "Div",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [3], positive: true }],
    build: (g, [a, b]) => g.op("Div", [a!, b!])
  },
  {
    name: "Pow (constant exponent)",
    inputs: [{ name: "a", dims: [5], positive: true }],
    build: (g, [a]) => g.op("Pow", [a!, scalar(g, 2.5)])
  },
  { name: "Neg", inputs: [{ name: "a", dims: [4] }], build: (g, [a]) => g.op("Neg", [a!]) },
  { name: "Exp", inputs: [{ name: "a", dims: [4] }], build: (g, [a]) => g.op("Exp", [a!]) },
  { name: "Log", inputs: [{ name: "a", dims: [4], positive: true }], build: (g, [a]) => g.op("Log", [a!]) },
  { name: "Sqrt", inputs: [{ name: "a", dims: [4], positive: true }], build: (g, [a]) => g.op("Sqrt", [a!]) },
  {
    name: "Reciprocal",
    inputs: [{ name: "a", dims: [4], positive: true }],
    build: (g, [a]) => g.op("Reciprocal", [a!])
  },
  { name: "Sigmoid", inputs: [{ name: "a", dims: [6] }], build: (g, [a]) => g.op("Sigmoid", [a!]) },
  {
    name: "SiLU: Mul of a value and its own Sigmoid (one fused rule)",
    inputs: [{ name: "a", dims: [6] }],
    build: (g, [a]) => g.op("Mul", [a!, g.op("Sigmoid", [a!])])
  },
  {
    name: "SiLU with the Sigmoid first, its output also used elsewhere",
    inputs: [{ name: "a", dims: [6] }],
    build: (g, [a]) => {
      const s = g.op("Sigmoid", [a!])
      return g.op("Add", [g.op("Mul", [s, a!]), g.op("Mul", [s, s])])
    }
  },
  { name: "Tanh", inputs: [{ name: "a", dims: [6] }], build: (g, [a]) => g.op("Tanh", [a!]) },
  { name: "Relu", inputs: [{ name: "a", dims: [6] }], build: (g, [a]) => g.op("Relu", [a!]) },
  { name: "Abs", inputs: [{ name: "a", dims: [6] }], build: (g, [a]) => g.op("Abs", [a!]) },
  {
    // onnxruntime has no float64 Erf kernel: checked in float32 between casts, with h = 1e-3 and tolerance 1e-3
    name: "Erf (float32)",
    inputs: [{ name: "a", dims: [6] }],
    build: (g, [a]) => g.op("Cast", [g.op("Erf", [g.op("Cast", [a!], { to: Graph.int(1) })])], { to: Graph.int(11) }),
    h: 1e-3,
    tolerance: 1e-3
  },
  {
    // float64 → float32 → float64: the gradient passes through both casts; float32 rounding needs a larger step
    name: "Cast (through float32, h = 1e-3, tolerance 1e-4)",
    inputs: [{ name: "a", dims: [5] }],
    build: (g, [a]) => {
      const narrow = g.op("Cast", [a!], { to: Graph.int(1) })
      return g.op("Cast", [g.op("Mul", [narrow, g.constant(Graph.float32([], [3]))])], { to: Graph.int(11) })
    },
    h: 1e-3,
    tolerance: 1e-4
  },
  { name: "Identity", inputs: [{ name: "a", dims: [3] }], build: (g, [a]) => g.op("Identity", [a!]) },
  {
    name: "Sum (three inputs, broadcast)",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [3] }, { name: "c", dims: [2, 1] }],
    build: (g, [a, b, c]) => g.op("Sum", [a!, b!, c!])
  },
  {
    name: "Max",
    inputs: [{ name: "a", dims: [6] }, { name: "b", dims: [6] }],
    build: (g, [a, b]) => g.op("Max", [a!, b!])
  },
  {
    name: "Min",
    inputs: [{ name: "a", dims: [6] }, { name: "b", dims: [6] }],
    build: (g, [a, b]) => g.op("Min", [a!, b!])
  },
  {
    name: "Clip",
    inputs: [{ name: "a", dims: [8] }],
    build: (g, [a]) => g.op("Clip", [a!, scalar(g, -0.3), scalar(g, 0.4)])
  },
  {
    name: "Where",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [3] }],
    build: (g, [a, b]) => {
      const cond = g.constant({ dtype: "bool", dims: [2, 3], data: Uint8Array.of(1, 0, 1, 0, 0, 1) })
      return g.op("Where", [cond, a!, b!])
    }
  },
  {
    name: "MatMul 2-D",
    inputs: [{ name: "a", dims: [3, 4] }, { name: "b", dims: [4, 2] }],
    build: (g, [a, b]) => g.op("MatMul", [a!, b!])
  },
  ...([[0, 0], [1, 0], [0, 1], [1, 1]] as const).map(([ta, tb]): Case => ({
    name: `Gemm (transA ${ta}, transB ${tb}, α 0.7, β 1.3, broadcast C)`,
    inputs: [
      { name: "a", dims: ta ? [4, 3] : [3, 4] },
      { name: "b", dims: tb ? [2, 4] : [4, 2] },
      { name: "c", dims: [2] }
    ],
    build: (g, [a, b, c]) =>
      g.op("Gemm", [a!, b!, c!], {
        alpha: Graph.float(0.7),
        beta: Graph.float(1.3),
        transA: Graph.int(ta),
        transB: Graph.int(tb)
      })
  })),
  {
    name: "MatMul N-D × 2-D",
    inputs: [{ name: "a", dims: [2, 3, 4] }, { name: "b", dims: [4, 2] }],
    build: (g, [a, b]) => g.op("MatMul", [a!, b!])
  },
  {
    name: "MatMul N-D × Wᵀ (a linear layer: the input's gradient reads W, not the transposed copy)",
    inputs: [{ name: "x", dims: [2, 3, 4] }, { name: "w", dims: [5, 4] }],
    build: (g, [x, w]) => g.op("MatMul", [x!, g.op("Transpose", [w!], { perm: Graph.ints([1, 0]) })])
  },
  {
    name: "MatMul batched with broadcast (GQA shape)",
    inputs: [{ name: "a", dims: [2, 1, 2, 3, 4] }, { name: "b", dims: [2, 1, 1, 4, 3] }],
    build: (g, [a, b]) => g.op("MatMul", [a!, b!])
  },
  {
    name: "MatMul batched with a transposed operand Xᵀ and broadcast (attention scores against the keys)",
    inputs: [{ name: "q", dims: [2, 2, 3, 4] }, { name: "k", dims: [2, 1, 5, 4] }],
    build: (g, [q, k]) => g.op("MatMul", [q!, g.op("Transpose", [k!], { perm: Graph.ints([0, 1, 3, 2]) })])
  },
  {
    name: "Softmax (last axis)",
    inputs: [{ name: "a", dims: [2, 5] }],
    build: (g, [a]) => g.op("Softmax", [a!], { axis: Graph.int(-1) })
  },
  {
    name: "Softmax (axis 1 of 3)",
    inputs: [{ name: "a", dims: [2, 3, 2] }],
    build: (g, [a]) => g.op("Softmax", [a!], { axis: Graph.int(1) })
  },
  {
    name: "LogSoftmax",
    inputs: [{ name: "a", dims: [3, 4] }],
    build: (g, [a]) => g.op("LogSoftmax", [a!], { axis: Graph.int(-1) })
  },
  {
    name: "Transpose",
    inputs: [{ name: "a", dims: [2, 3, 4] }],
    build: (g, [a]) => g.op("Transpose", [a!], { perm: Graph.ints([2, 0, 1]) })
  },
  {
    name: "Reshape (0 and -1)",
    inputs: [{ name: "a", dims: [2, 3, 4] }],
    build: (g, [a]) => g.op("Reshape", [a!, i64(g, [0, -1])])
  },
  {
    name: "Flatten",
    inputs: [{ name: "a", dims: [2, 3, 2] }],
    build: (g, [a]) => g.op("Flatten", [a!], { axis: Graph.int(1) })
  },
  {
    name: "Unsqueeze",
    inputs: [{ name: "a", dims: [2, 3] }],
    build: (g, [a]) => g.op("Unsqueeze", [a!, i64(g, [0, 2])])
  },
  { name: "Squeeze", inputs: [{ name: "a", dims: [2, 1, 3] }], build: (g, [a]) => g.op("Squeeze", [a!, i64(g, [1])]) },
  { name: "Expand", inputs: [{ name: "a", dims: [3, 1] }], build: (g, [a]) => g.op("Expand", [a!, i64(g, [2, 3, 4])]) },
  {
    name: "Concat",
    inputs: [{ name: "a", dims: [2, 3] }, { name: "b", dims: [2, 1] }],
    build: (g, [a, b]) => g.op("Concat", [a!, b!], { axis: Graph.int(-1) })
  },
  {
    name: "Split (one output unused)",
    inputs: [{ name: "a", dims: [2, 6] }],
    build: (g, [a]) => g.opN("Split", [a!, i64(g, [2, 3, 1])], 3, { axis: Graph.int(1) })[1]!
  },
  {
    name: "Slice (negative start, axes)",
    inputs: [{ name: "a", dims: [3, 6] }],
    build: (g, [a]) => g.op("Slice", [a!, i64(g, [-4]), i64(g, [5]), i64(g, [1])])
  },
  {
    name: "Gather axis 0 (repeated ids accumulate)",
    inputs: [{ name: "a", dims: [5, 3] }],
    build: (g, [a]) => g.op("Gather", [a!, g.constant(Graph.int64([2, 3], [1, 4, 1, 0, 1, 3]))], { axis: Graph.int(0) })
  },
  {
    name: "GatherElements",
    inputs: [{ name: "a", dims: [3, 4] }],
    build: (g, [a]) => {
      const indices = g.constant(Graph.int64([3, 2], [0, 3, 1, 1, 2, 0]))
      return g.op("GatherElements", [a!, indices], { axis: Graph.int(1) })
    }
  },
  {
    name: "ReduceSum (axes input)",
    inputs: [{ name: "a", dims: [2, 3, 4] }],
    build: (g, [a]) => g.op("ReduceSum", [a!, i64(g, [1])], { keepdims: Graph.int(0) })
  },
  {
    name: "ReduceMean (axes attribute)",
    inputs: [{ name: "a", dims: [2, 3, 4] }],
    build: (g, [a]) => g.op("ReduceMean", [a!], { axes: Graph.ints([-1]), keepdims: Graph.int(1) })
  },
  {
    name: "ReduceMax",
    inputs: [{ name: "a", dims: [3, 4] }],
    build: (g, [a]) => g.op("ReduceMax", [a!], { axes: Graph.ints([1]), keepdims: Graph.int(0) })
  },
  {
    name: "RMSNorm composite (as the model emits it)",
    inputs: [{ name: "x", dims: [2, 3, 4] }, { name: "w", dims: [4] }],
    build: (g, [x, w]) => {
      const ms = g.op("ReduceMean", [g.op("Mul", [x!, x!])], { axes: Graph.ints([-1]), keepdims: Graph.int(1) })
      const inv = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [ms, scalar(g, 1e-6)])])])
      return g.op("Mul", [g.op("Mul", [x!, inv]), w!])
    }
  }
]

/** Builds Σ R ⊙ f(x…) as `loss` and differentiates it with respect to every input. */
const build = (c: Case) =>
  Effect.gen(function*() {
    const g = Graph.make(c.name)
    const xs = c.inputs.map((i) => g.input(i.name, "float64", i.dims))
    const y = c.build(g, xs)
    // Shapes of y are needed for R: run shape inference through Autodiff on a copy-free path.
    const Shapes = yield* Effect.promise(() => import("../../../src/autodiff/Shapes.ts"))
    const dims = Shapes.make(g, {}).get(y).dims
    const n = dims.reduce((a, b) => a * b, 1)
    const r = g.constant(f64(dims, noise(n, 99).map((v) => v + 0.5)))
    g.node("ReduceSum", [g.op("Mul", [y, r])], ["loss"], { keepdims: Graph.int(0) })
    g.output("loss", "float64", [])
    yield* Autodiff.gradients(g, "loss", xs)
    const feeds: Record<string, Feed> = {}
    c.inputs.forEach((i, k) => {
      const m = i.dims.reduce((a, b) => a + 0 * b, 0) + i.dims.reduce((a, b) => a * b, 1)
      const values = noise(m, 7 + 13 * k).map((v) => (i.positive ? 0.5 + Math.abs(v) : v))
      feeds[i.name] = { dtype: "float64", dims: i.dims, data: values }
    })
    return { g, feeds, wrt: xs }
  })

describe("Backward rules against central differences (float64)", () => {
  for (const c of cases) {
    it.effect(c.name, () =>
      Effect.gen(function*() {
        const { g, feeds, wrt } = yield* build(c)
        const s = yield* session(g)
        const { worst } = yield* check(s, feeds, wrt, c.h === undefined ? {} : { h: c.h })
        for (const w of wrt) assert.isBelow(worst[w]!, c.tolerance ?? 1e-6, `${c.name}: d/d${w} rel. error ${worst[w]}`)
      }))
  }

  it.effect("only the partials of inputs that need a gradient are emitted (onnxruntime keeps unused nodes)", () =>
    Effect.gen(function*() {
      const g = Graph.make("partials")
      const x = g.input("x", "float64", [4])
      const y = g.op("Div", [g.op("Sub", [g.op("Mul", [x, scalar(g, 3)]), scalar(g, 1)]), scalar(g, 2)])
      g.node("ReduceSum", [y], ["loss"], { keepdims: Graph.int(0) })
      const before = g.nodes.length
      yield* Autodiff.gradients(g, "loss", [x])
      const ops = g.nodes.slice(before).map((n) => n.op)
      // One Div and one Mul for ∂/∂a (besides the seed's Reshape/Expand and the output's Identity): no Neg, Div or
      // Mul for the constant operands.
      assert.deepStrictEqual(ops.filter((op) => ["Div", "Mul", "Neg", "Sub"].includes(op)), ["Div", "Mul"])
    }))

  it.effect("a linear layer's backward does not read the forward's transposed weight (so it is freed at once)", () =>
    Effect.gen(function*() {
      const g = Graph.make("linear")
      const x = g.input("x", "float64", [2, 3, 4])
      const w = g.input("w", "float64", [5, 4])
      const wT = g.op("Transpose", [w], { perm: Graph.ints([1, 0]) })
      g.node("ReduceSum", [g.op("Mul", [g.op("MatMul", [x, wT]), g.op("MatMul", [x, wT])])], ["loss"], {
        keepdims: Graph.int(0)
      })
      const before = g.nodes.length
      yield* Autodiff.gradients(g, "loss", [x, w])
      const backward = g.nodes.slice(before)
      assert.isFalse(backward.some((n) => n.inputs.includes(wT)), "a backward node reads Wᵀ")
      assert.isTrue(backward.some((n) => n.op === "MatMul" && n.inputs[1] === w), "∂x = ∂y · W")
    }))

  it.effect("an op without a backward rule is a typed NoBackwardRule error", () =>
    Effect.gen(function*() {
      const g = Graph.make("nobackward")
      const x = g.input("x", "float64", [4])
      g.node("ReduceSum", [g.op("Round", [x])], ["loss"], { keepdims: Graph.int(0) })
      const error = yield* Effect.flip(Autodiff.gradients(g, "loss", [x]))
      assert.strictEqual(error.reason._tag, "ShapeInference") // Round has neither a shape rule nor a backward rule
      const g2 = Graph.make("nobackward2")
      const y = g2.input("y", "float64", [4])
      g2.node("ReduceSum", [g2.op("Trilu", [g2.op("Reshape", [y, g2.constant(Graph.int64([2], [2, 2]))])])], ["loss"], {
        keepdims: Graph.int(0)
      })
      const error2 = yield* Effect.flip(Autodiff.gradients(g2, "loss", [y]))
      assert.strictEqual(error2.reason._tag, "NoBackwardRule")
      const op = yield* Autodiff.gradients(g2, "loss", [y]).pipe(
        Effect.as(undefined),
        Effect.catchReason("AutodiffError", "NoBackwardRule", (reason) => Effect.succeed(reason.op))
      )
      assert.strictEqual(op, "Trilu")
      assert.instanceOf(error.reason.cause, Error) // what the shape rules threw
    }))

  it.effect("differentiating with respect to an integer input or a constant loss is a typed error", () =>
    Effect.gen(function*() {
      const g = Graph.make("ints")
      const ids = g.input("ids", "int64", [3])
      const w = g.input("w", "float64", [3])
      g.node("ReduceSum", [g.op("Cast", [ids], { to: Graph.int(11) })], ["loss"], { keepdims: Graph.int(0) })
      assert.strictEqual((yield* Effect.flip(Autodiff.gradients(g, "loss", [ids]))).reason._tag, "NotDifferentiable")
      assert.strictEqual((yield* Effect.flip(Autodiff.gradients(g, "loss", [w]))).reason._tag, "NotDifferentiable")
      assert.strictEqual((yield* Effect.flip(Autodiff.gradients(g, "loss", ["nope"]))).reason._tag, "UnknownValue")
    }))
})
