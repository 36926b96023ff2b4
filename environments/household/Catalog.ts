/**
 * What a household or science world can hold: the kinds of rooms, receptacles and objects, and the facts about
 * each kind the engine reads (can it be opened, is a thing put `in` or `on` it, what appliance or device it is,
 * which substance melts or boils at which temperature). Read-only module constants, shared by every world.
 *
 * Names follow ALFWorld (`sinkbasin`, `countertop`, `desklamp`: one word per kind) for the household, and
 * ScienceWorld (`light bulb`, `flower pot`) for the science rooms; an instance is its kind and a number
 * (`cabinet 2`, `light bulb 1`).
 *
 * @since 0.1.0
 */

// ===== Models =====

/**
 * What a receptacle kind is: opened and closed or not, the preposition of its contents, and its role:
 * - `microwave` / `fridge` / `sink`: the household appliances of `heat X with Y`, `cool X with Y`, `clean X with Y`;
 *   the fridge also cools what is in it to 4 °C, tick by tick;
 * - `stove`: a heat source switched with `use` (+25 °C a tick while on, up to 250 °C);
 * - `freezer`: cools what is in it (−10 °C a tick, down to −18 °C);
 * - `pot`: a flower pot (a seed in it grows when it holds soil and was watered).
 *
 * @category models
 * @since 0.1.0
 */
export interface ReceptacleKind {
  readonly openable: boolean
  readonly prep: "in" | "on"
  readonly role?: "microwave" | "fridge" | "sink" | "stove" | "freezer" | "pot" | undefined
}

/**
 * What an object kind is: whether it can be carried, its device or tool role, and its substance (phase points).
 * - `lamp`: a desklamp, switched with `use`; `thermometer` and `watering can`: tools of `use X on Y`;
 * - `electric`: a component with two terminals (`connect X to Y`); `battery` powers a circuit, `device` runs in one;
 * - `seed`: grows into a sprout in a watered pot with soil.
 *
 * @category models
 * @since 0.1.0
 */
export interface ObjectKind {
  readonly fixed?: boolean | undefined
  readonly role?: "lamp" | "thermometer" | "water" | "battery" | "wire" | "device" | "seed" | "soil" | undefined
  /** Melting and boiling points in °C, for the substances whose phase the engine tracks. */
  readonly melts?: number | undefined
  readonly boils?: number | undefined
}

/**
 * A room kind: its family, the receptacle kinds it may hold and the object kinds found in it.
 *
 * @category models
 * @since 0.1.0
 */
export interface RoomKind {
  readonly family: "household" | "science"
  readonly receptacles: ReadonlyArray<string>
  readonly objects: ReadonlyArray<string>
}

// ===== Kinds =====

const open = (prep: "in" | "on", role?: ReceptacleKind["role"]): ReceptacleKind => ({ openable: false, prep, role })
const shut = (role?: ReceptacleKind["role"]): ReceptacleKind => ({ openable: true, prep: "in", role })

/**
 * Receptacle kinds.
 *
 * @category constants
 * @since 0.1.0
 */
export const receptacles: Readonly<Record<string, ReceptacleKind>> = {
  armchair: open("on"),
  bathtubbasin: open("in"),
  bed: open("on"),
  "blue box": open("in"),
  cabinet: shut(),
  coffeetable: open("on"),
  counter: open("on"),
  countertop: open("on"),
  cupboard: shut(),
  desk: open("on"),
  diningtable: open("on"),
  drawer: shut(),
  dresser: open("on"),
  "flower pot": open("in", "pot"),
  freezer: shut("freezer"),
  fridge: shut("fridge"),
  garbagecan: open("in"),
  microwave: shut("microwave"),
  "red box": open("in"),
  safe: shut(),
  "seed jar": shut(),
  shelf: open("on"),
  sidetable: open("on"),
  sinkbasin: open("in", "sink"),
  sofa: open("on"),
  stove: open("on", "stove"),
  stoveburner: open("on"),
  table: open("on"),
  toilet: open("on"),
  toolbox: shut(),
  towelholder: open("on"),
  tvstand: open("on"),
  workbench: open("on")
}

/**
 * Object kinds (any kind not listed here is an ordinary object: carried, no role).
 *
 * @category constants
 * @since 0.1.0
 */
export const objects: Readonly<Record<string, ObjectKind>> = {
  desklamp: { fixed: true, role: "lamp" },
  thermometer: { role: "thermometer" },
  "watering can": { role: "water" },
  battery: { role: "battery" },
  wire: { role: "wire" },
  "light bulb": { role: "device" },
  buzzer: { role: "device" },
  motor: { role: "device" },
  "bean seed": { role: "seed" },
  "pea seed": { role: "seed" },
  "sunflower seed": { role: "seed" },
  soil: { fixed: true, role: "soil" },
  water: { melts: 0, boils: 100 },
  milk: { melts: 0, boils: 100 },
  juice: { melts: -2, boils: 100 },
  butter: { melts: 32, boils: 250 },
  chocolate: { melts: 34 },
  wax: { melts: 60 }
}

/**
 * The facts of an object kind (ordinary for kinds without any).
 *
 * @category getters
 * @since 0.1.0
 */
export const objectKind = (kind: string): ObjectKind => objects[kind] ?? {}

/**
 * Room kinds. ALFWorld's four scenes make the household; ScienceWorld's kitchen, workshop and greenhouse the
 * science family.
 *
 * @category constants
 * @since 0.1.0
 */
export const rooms: Readonly<Record<string, RoomKind>> = {
  kitchen: {
    family: "household",
    receptacles: ["cabinet", "countertop", "diningtable", "drawer", "fridge", "garbagecan", "microwave", "shelf",
      "sinkbasin", "stoveburner"],
    objects: ["apple", "bowl", "bread", "cup", "egg", "fork", "kettle", "knife", "lettuce", "mug", "pan", "plate",
      "pot", "potato", "saltshaker", "spatula", "spoon", "tomato", "winebottle"]
  },
  livingroom: {
    family: "household",
    receptacles: ["armchair", "coffeetable", "drawer", "dresser", "garbagecan", "safe", "shelf", "sidetable", "sofa",
      "tvstand"],
    objects: ["book", "box", "cd", "creditcard", "keychain", "laptop", "pillow", "remotecontrol", "statue", "vase",
      "watch"]
  },
  bedroom: {
    family: "household",
    receptacles: ["bed", "desk", "drawer", "dresser", "garbagecan", "safe", "shelf", "sidetable"],
    objects: ["alarmclock", "book", "cd", "cellphone", "creditcard", "keychain", "laptop", "pen", "pencil", "pillow",
      "watch"]
  },
  bathroom: {
    family: "household",
    receptacles: ["bathtubbasin", "cabinet", "countertop", "drawer", "garbagecan", "shelf", "sinkbasin", "toilet",
      "towelholder"],
    objects: ["candle", "cloth", "soapbar", "soapbottle", "spraybottle", "tissuebox", "toiletpaper", "towel"]
  },
  "science kitchen": {
    family: "science",
    receptacles: ["counter", "cupboard", "drawer", "freezer", "fridge", "shelf", "stove", "table"],
    objects: ["bowl", "cup", "fork", "spoon", "book", "glass"]
  },
  workshop: {
    family: "science",
    receptacles: ["drawer", "shelf", "table", "toolbox", "workbench"],
    objects: ["hammer", "nail", "screwdriver", "tape", "glove"]
  },
  greenhouse: {
    family: "science",
    receptacles: ["drawer", "flower pot", "seed jar", "shelf", "table"],
    objects: ["glove", "shovel", "bucket", "rake"]
  }
}

/**
 * The name a room is shown and walked to by (`go to kitchen`): science rooms drop their family word.
 *
 * @category getters
 * @since 0.1.0
 */
export const roomName = (kind: string): string => kind.replace(/^science /, "")

// ===== Task kinds =====

/**
 * Objects each household task type may ask for (ALFWorld's lists, within the rooms above).
 *
 * @category constants
 * @since 0.1.0
 */
export const taskObjects = {
  heat: ["apple", "bread", "cup", "egg", "mug", "plate", "potato", "tomato"],
  cool: ["apple", "bowl", "bread", "cup", "egg", "lettuce", "mug", "pan", "plate", "pot", "potato", "tomato",
    "winebottle"],
  clean: ["apple", "bowl", "cloth", "cup", "egg", "fork", "kettle", "knife", "lettuce", "mug", "pan", "plate", "pot",
    "potato", "soapbar", "spatula", "spoon", "tomato"],
  look: ["alarmclock", "book", "box", "cd", "cellphone", "creditcard", "keychain", "laptop", "pen", "pencil", "pillow",
    "remotecontrol", "statue", "vase", "watch"]
} as const

/**
 * Receptacles a household goal may name as its target.
 *
 * @category constants
 * @since 0.1.0
 */
export const targets: ReadonlyArray<string> = [
  "armchair", "bed", "cabinet", "coffeetable", "countertop", "desk", "diningtable", "drawer", "dresser", "garbagecan",
  "safe", "shelf", "sidetable", "sofa", "toilet", "towelholder", "tvstand"
]

/**
 * Where a desklamp stands in a room that has one.
 *
 * @category constants
 * @since 0.1.0
 */
export const lampStands: ReadonlyArray<string> = ["desk", "dresser", "sidetable"]

/**
 * The substances of the phase-change task, by change, with the temperature they start at and where they are kept.
 *
 * @category constants
 * @since 0.1.0
 */
export const phaseStarts = {
  melt: [
    { substance: "water", temp: -10, keep: ["freezer"] },
    { substance: "butter", temp: 4, keep: ["fridge"] },
    { substance: "chocolate", temp: 20, keep: ["cupboard", "counter", "shelf"] },
    { substance: "wax", temp: 20, keep: ["cupboard", "drawer", "shelf"] }
  ],
  boil: [
    { substance: "water", temp: 20, keep: ["counter", "cupboard", "table"] },
    { substance: "milk", temp: 4, keep: ["fridge"] }
  ],
  freeze: [
    { substance: "water", temp: 20, keep: ["counter", "cupboard", "table"] },
    { substance: "juice", temp: 4, keep: ["fridge"] },
    { substance: "milk", temp: 4, keep: ["fridge"] }
  ]
} as const

/**
 * Things whose temperature the measurement task asks about, with the range they are drawn from (°C).
 *
 * @category constants
 * @since 0.1.0
 */
export const measured: ReadonlyArray<{ readonly kind: string; readonly min: number; readonly max: number }> = [
  { kind: "tea", min: 45, max: 90 },
  { kind: "soup", min: 50, max: 95 },
  { kind: "coffee", min: 40, max: 85 },
  { kind: "lemonade", min: 2, max: 25 },
  { kind: "yogurt", min: 2, max: 15 },
  { kind: "rock", min: 5, max: 60 }
]
