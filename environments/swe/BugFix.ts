/**
 * Seeded bug-fix tasks as Harbor task folders: a small Python module (`/app/textutil.py`, eight functions) with
 * one bug planted in one function, an instruction that names the function and the symptom, a verifier that runs
 * the function's tests (plain `unittest`, nothing to install) and writes 1 or 0 to `/logs/verifier/reward.txt`, and
 * a reference solution (`solution/solve.sh`) that undoes the bug. The environment is `FROM agentfly/python:1` (the
 * project's local image, `scripts/build-images`) with the module copied in; the tests are not in the image (Harbor
 * copies them in after the agent).
 *
 * Each task draws a bug from {@link bugs} and fresh test values, so tasks of one bug differ in their tests; tasks
 * sharing a bug share their environment and so their image.
 *
 * @since 0.1.0
 */
import { Effect, FileSystem } from "effect"
import * as Sampling from "../../src/Sampling.ts"

// ===== The module =====

/**
 * A function of the module: its correct source, and its tests as `(call, expected)` Python expressions drawn from
 * a stream of numbers.
 */
interface Fn {
  readonly name: string
  readonly source: string
  readonly cases: (next: () => number) => ReadonlyArray<readonly [string, string]>
}

const int = (next: () => number, lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1))
const words = ["alpha", "beta", "gamma", "delta", "omega", "kappa", "sigma", "theta"]
const word = (next: () => number) => words[Math.floor(next() * words.length)]!

const functions: ReadonlyArray<Fn> = [
  {
    name: "clamp",
    source: "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
    cases: (next) => {
      const lo = int(next, -10, 0), hi = int(next, 1, 10)
      return [[`clamp(${hi + 5}, ${lo}, ${hi})`, `${hi}`], [`clamp(${lo - 3}, ${lo}, ${hi})`, `${lo}`], [
        `clamp(0, ${lo}, ${hi})`,
        "0"
      ]]
    }
  },
  {
    name: "mean",
    source: "def mean(xs):\n    return sum(xs) / len(xs)\n",
    cases: (next) => {
      const xs = [int(next, 1, 9), int(next, 1, 9), int(next, 1, 9), int(next, 1, 9)]
      return [[`mean([${xs}])`, `${xs.reduce((a, b) => a + b, 0) / 4}`], [`mean([${xs[0]}])`, `${xs[0]}`]]
    }
  },
  {
    name: "is_palindrome",
    source:
      "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
    cases: (next) => {
      const w = word(next)
      const p = w + [...w].reverse().join("")
      return [[`is_palindrome(${JSON.stringify(p[0]!.toUpperCase() + p.slice(1))})`, "True"], [
        `is_palindrome(${JSON.stringify(w)})`,
        "False"
      ], [`is_palindrome("A man, a plan, a canal: Panama")`, "True"]]
    }
  },
  {
    name: "last_n",
    source: "def last_n(xs, n):\n    return xs[-n:] if n > 0 else []\n",
    cases: (next) => {
      const n = int(next, 1, 3)
      const xs = [int(next, 0, 9), int(next, 0, 9), int(next, 0, 9), int(next, 0, 9), int(next, 0, 9)]
      return [[`last_n([${xs}], ${n})`, `[${xs.slice(-n).join(", ")}]`], [`last_n([${xs}], 0)`, "[]"]]
    }
  },
  {
    name: "word_count",
    source: "def word_count(s):\n    return len(s.split())\n",
    cases: (next) => {
      const ws = [word(next), word(next), word(next)]
      return [[`word_count(${JSON.stringify(ws.join(" "))})`, "3"], [
        `word_count(${JSON.stringify(`  ${ws.join("  ")} `)})`,
        "3"
      ], [`word_count("")`, "0"]]
    }
  },
  {
    name: "count_vowels",
    source: "def count_vowels(s):\n    return sum(1 for c in s.lower() if c in \"aeiou\")\n",
    cases: (next) => {
      const w = word(next)
      const n = [...w].filter((c) => "aeiou".includes(c)).length
      return [
        [`count_vowels(${JSON.stringify(w.toUpperCase())})`, `${n}`],
        [`count_vowels(${JSON.stringify(w)})`, `${n}`]
      ]
    }
  },
  {
    name: "factorial",
    source: "def factorial(n):\n    out = 1\n    for k in range(2, n + 1):\n        out *= k\n    return out\n",
    cases: (next) => {
      const n = int(next, 3, 7)
      let f = 1
      for (let k = 2; k <= n; k++) f *= k
      return [[`factorial(${n})`, `${f}`], ["factorial(0)", "1"], ["factorial(1)", "1"]]
    }
  },
  {
    name: "chunks",
    source: "def chunks(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs), size)]\n",
    cases: (next) => {
      const size = int(next, 2, 3)
      const xs = Array.from({ length: int(next, 5, 7) }, (_, i) => i + 1)
      const out: Array<Array<number>> = []
      for (let i = 0; i < xs.length; i += size) out.push(xs.slice(i, i + size))
      return [[`chunks([${xs}], ${size})`, JSON.stringify(out).replace(/,/g, ", ")]]
    }
  }
]

/**
 * A planted bug: the function, the line as the bug has it and as it should be, and the symptom the instruction
 * reports.
 *
 * @category models
 * @since 0.1.0
 */
export interface Bug {
  readonly fn: string
  readonly correct: string
  readonly broken: string
  readonly symptom: string
}

/**
 * The bugs the generator plants (each a one-line change).
 *
 * @category constants
 * @since 0.1.0
 */
export const bugs: ReadonlyArray<Bug> = [
  {
    fn: "clamp",
    correct: "return max(lo, min(x, hi))",
    broken: "return max(lo, min(x, lo))",
    symptom: "returns lo for values above lo"
  },
  {
    fn: "mean",
    correct: "return sum(xs) / len(xs)",
    broken: "return sum(xs) / (len(xs) - 1)",
    symptom: "is too large"
  },
  {
    fn: "is_palindrome",
    correct: "t = [c.lower() for c in s if c.isalnum()]",
    broken: "t = [c for c in s if c.isalnum()]",
    symptom: "is case-sensitive"
  },
  {
    fn: "last_n",
    correct: "return xs[-n:] if n > 0 else []",
    broken: "return xs[-n:]",
    symptom: "returns the whole list for n = 0"
  },
  {
    fn: "word_count",
    correct: "return len(s.split())",
    broken: "return len(s.split(\" \"))",
    symptom: "counts too many words when there are extra spaces"
  },
  {
    fn: "count_vowels",
    correct: "return sum(1 for c in s.lower() if c in \"aeiou\")",
    broken: "return sum(1 for c in s if c in \"aeiou\")",
    symptom: "misses upper-case vowels"
  },
  {
    fn: "factorial",
    correct: "for k in range(2, n + 1):",
    broken: "for k in range(2, n):",
    symptom: "is off by one factor"
  },
  {
    fn: "chunks",
    correct: "return [xs[i:i + size] for i in range(0, len(xs), size)]",
    broken: "return [xs[i:i + size] for i in range(0, len(xs) - size, size)]",
    symptom: "drops the last chunk"
  }
]

// ===== Folders =====

/**
 * One generated task: its folder name and files (relative path → contents), and the instruction.
 *
 * @category models
 * @since 0.1.0
 */
export interface Generated {
  readonly name: string
  readonly instruction: string
  readonly bug: Bug
  readonly files: ReadonlyMap<string, string>
}

const moduleSource = (bug: Bug): string =>
  `"""Small text and list helpers."""\n\n\n` +
  functions.map((f) => (f.name === bug.fn ? f.source.replace(bug.correct, bug.broken) : f.source)).join("\n\n")

/**
 * The task of a bug with test values from `next`.
 *
 * @category constructors
 * @since 0.1.0
 */
export const task = (name: string, bug: Bug, next: () => number): Generated => {
  const fn = functions.find((f) => f.name === bug.fn)!
  const cases = fn.cases(next)
  const instruction = `\`${bug.fn}\` in textutil.py ${bug.symptom}. Fix it, then submit.`
  const test = [
    "import sys, unittest",
    "sys.path.insert(0, \"/app\")",
    "from textutil import *",
    "",
    "",
    "class Test(unittest.TestCase):",
    ...cases.map(([call, expected], i) => `    def test_${i}(self):\n        self.assertEqual(${call}, ${expected})\n`),
    "",
    "if __name__ == \"__main__\":",
    "    unittest.main()",
    ""
  ].join("\n")
  const files = new Map<string, string>([
    [
      "task.toml",
      `version = "1.0"\n\n[task]\nname = "${name}"\n\n[metadata]\ndifficulty = "easy"\ncategory = "debugging"\n` +
      `tags = ["python", "${bug.fn}"]\n\n[verifier]\ntimeout_sec = 60.0\n\n[agent]\ntimeout_sec = 300.0\n\n` +
      `[environment]\nbuild_timeout_sec = 300.0\ncpus = 1\nmemory_mb = 512\n`
    ],
    ["instruction.md", `${instruction}\n`],
    ["environment/Dockerfile", "FROM agentfly/python:1\nCOPY textutil.py /app/textutil.py\nWORKDIR /app\n"],
    ["environment/textutil.py", moduleSource(bug)],
    [
      "tests/test.sh",
      "#!/bin/sh\nmkdir -p /logs/verifier\nif python3 /tests/test_outputs.py > /logs/verifier/output.txt 2>&1; then\n" +
      "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    ],
    ["tests/test_outputs.py", test],
    [
      "solution/solve.sh",
      `#!/bin/sh\npython3 - <<'EOF'\np = "/app/textutil.py"\ns = open(p).read()\n` +
      `s = s.replace(${JSON.stringify(bug.broken)}, ${JSON.stringify(bug.correct)}, 1)\nopen(p, "w").write(s)\nEOF\n`
    ]
  ])
  return { name, instruction, bug, files }
}

/**
 * `count` seeded tasks, named `<prefix>-<n>`, bugs drawn in turn from a seeded shuffle.
 *
 * @category constructors
 * @since 0.1.0
 */
export const generate = (seed: number, count: number, prefix = "fix"): Array<Generated> => {
  const next = Sampling.mulberry32(seed)
  const order = bugs.map((b) => [next(), b] as const).sort((a, b) => a[0] - b[0]).map(([, b]) => b)
  return Array.from({ length: count }, (_, i) => task(`${prefix}-${i}`, order[i % order.length]!, next))
}

/**
 * Writes tasks as folders under `root` (created if missing).
 *
 * @category constructors
 * @since 0.1.0
 */
export const write = Effect.fnUntraced(function*(root: string, tasks: ReadonlyArray<Generated>) {
  const fs = yield* FileSystem.FileSystem
  for (const t of tasks) {
    for (const [path, contents] of t.files) {
      const full = `${root}/${t.name}/${path}`
      yield* fs.makeDirectory(full.slice(0, full.lastIndexOf("/")), { recursive: true })
      yield* fs.writeFileString(full, contents)
    }
  }
})
