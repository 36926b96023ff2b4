/**
 * The vocabulary of the generated shop: product types in a three-level category tree, each with the attributes its
 * products may have, the option dimensions a buyer chooses from (size, color, flavor, ...), and a price range.
 *
 * Everything is lower case and short, because a byte-level policy reads and copies it. Within one type, option
 * values are distinct across dimensions (a value names its dimension), and no option value is also an attribute,
 * so `select` needs only the value and the instruction's words each mean one thing. `test/environments/webshop`
 * checks both rules.
 *
 * @since 0.1.0
 */

/**
 * A product type of the generated shop.
 *
 * @category models
 * @since 0.1.0
 */
export interface ProductType {
  /** The type's name, the last words of every title of the type ("t-shirt", "phone case"). */
  readonly name: string
  /** Whether the name is plural ("jeans"): the instruction then says "i want jeans", not "i want a jeans". */
  readonly plural?: boolean | undefined
  /** The category path, top level first. */
  readonly category: readonly [string, string, string]
  /** Attribute slots; a slot of alternatives ("slim fit|relaxed fit") gives a product at most one of them. */
  readonly attributes: ReadonlyArray<string>
  /** Option dimensions and their values (a product offers a subset of each). */
  readonly options: Readonly<Record<string, ReadonlyArray<string>>>
  /** Prices are drawn uniformly in [min, max] dollars. */
  readonly price: readonly [number, number]
}

const sizes = ["xs", "s", "m", "l", "xl", "xxl"]
const colors = ["black", "white", "red", "navy", "grey", "green", "blue", "pink", "brown", "beige"]
const shoeSizes = ["6", "7", "8", "9", "10", "11", "12"]
const deviceColors = ["black", "white", "silver", "blue", "red", "rose gold"]

/**
 * The product types (48, in 7 top-level categories).
 *
 * @category constants
 * @since 0.1.0
 */
export const types: ReadonlyArray<ProductType> = [
  // Fashion
  {
    name: "t-shirt",
    category: ["fashion", "tops", "t-shirts"],
    attributes: [
      "cotton|polyester", "slim fit|relaxed fit", "short sleeve|long sleeve", "v-neck|crew neck", "machine wash",
      "moisture wicking", "graphic print", "pocket"
    ],
    options: { size: sizes, color: colors },
    price: [8, 40]
  },
  {
    name: "hoodie",
    category: ["fashion", "tops", "hoodies"],
    attributes: [
      "fleece|cotton", "zip up|pullover", "kangaroo pocket", "relaxed fit", "machine wash", "lined hood", "thumb holes",
      "heavyweight"
    ],
    options: { size: sizes, color: colors },
    price: [20, 70]
  },
  {
    name: "jeans",
    plural: true,
    category: ["fashion", "bottoms", "jeans"],
    attributes: [
      "slim fit|straight leg|relaxed fit", "stretch", "high waist", "distressed", "button fly", "machine wash",
      "raw denim", "cropped"
    ],
    options: {
      size: ["28w", "30w", "32w", "34w", "36w", "38w"],
      color: ["blue", "black", "light blue", "grey", "white"]
    },
    price: [25, 90]
  },
  {
    name: "leggings",
    plural: true,
    category: ["fashion", "bottoms", "leggings"],
    attributes: [
      "high waist", "squat proof", "tummy control", "moisture wicking", "side pockets", "stretch", "yoga", "seamless"
    ],
    options: { size: sizes, color: colors },
    price: [12, 50]
  },
  {
    name: "dress",
    category: ["fashion", "dresses", "casual dresses"],
    attributes: ["floral", "maxi|midi", "sleeveless", "v-neck", "wrap", "chiffon|cotton", "pockets", "belted"],
    options: { size: sizes, color: colors },
    price: [20, 80]
  },
  {
    name: "jacket",
    category: ["fashion", "outerwear", "jackets"],
    attributes: [
      "waterproof", "hooded", "insulated", "windproof", "packable", "fleece lined", "lightweight", "zip pockets"
    ],
    options: { size: sizes, color: colors },
    price: [35, 160]
  },
  {
    name: "sneakers",
    plural: true,
    category: ["fashion", "shoes", "sneakers"],
    attributes: ["running", "lightweight", "breathable", "slip on", "memory foam", "non slip", "leather", "mesh"],
    options: { size: shoeSizes, color: colors },
    price: [30, 120]
  },
  {
    name: "boots",
    plural: true,
    category: ["fashion", "shoes", "boots"],
    attributes: ["leather", "waterproof", "ankle", "winter", "non slip", "lace up", "faux fur", "side zipper"],
    options: { size: shoeSizes, color: ["black", "brown", "tan", "grey"] },
    price: [40, 150]
  },
  {
    name: "socks",
    plural: true,
    category: ["fashion", "accessories", "socks"],
    attributes: [
      "cotton|wool", "cushioned", "ankle|crew|no show", "moisture wicking", "compression", "arch support", "breathable",
      "reinforced heel"
    ],
    options: { size: ["s", "m", "l"], pack: ["3 pack", "6 pack", "12 pack"] },
    price: [6, 30]
  },
  {
    name: "hat",
    category: ["fashion", "accessories", "hats"],
    attributes: ["wool", "cotton", "adjustable", "knit", "sun protection", "breathable", "winter", "baseball"],
    options: { color: colors },
    price: [8, 35]
  },
  // Home
  {
    name: "pillow",
    category: ["home", "bedding", "pillows"],
    attributes: [
      "memory foam|down alternative", "cooling", "hypoallergenic", "machine washable", "firm|soft", "adjustable",
      "side sleeper", "zippered cover"
    ],
    options: { size: ["standard", "queen", "king"], pack: ["1 pack", "2 pack", "4 pack"] },
    price: [15, 70]
  },
  {
    name: "blanket",
    category: ["home", "bedding", "blankets"],
    attributes: ["fleece", "sherpa", "weighted", "cotton", "soft", "lightweight", "machine washable", "reversible"],
    options: { size: ["throw", "twin", "full", "queen", "king"], color: colors },
    price: [18, 90]
  },
  {
    name: "sheet set",
    category: ["home", "bedding", "sheets"],
    attributes: ["cotton", "microfiber", "deep pocket", "cooling", "wrinkle free", "bamboo", "breathable", "soft"],
    options: { size: ["twin", "full", "queen", "king"], color: colors },
    price: [20, 110]
  },
  {
    name: "curtains",
    plural: true,
    category: ["home", "decor", "curtains"],
    attributes: [
      "blackout", "thermal insulated", "sheer", "grommet", "linen", "room darkening", "noise reducing", "rod pocket"
    ],
    options: { size: ["52x63", "52x84", "52x95"], color: colors },
    price: [15, 60]
  },
  {
    name: "rug",
    category: ["home", "decor", "rugs"],
    attributes: ["washable", "non slip", "shag", "boho", "vintage", "indoor outdoor", "low pile", "jute"],
    options: { size: ["2x3", "3x5", "5x7", "8x10"], color: ["grey", "beige", "blue", "black", "green", "pink"] },
    price: [20, 200]
  },
  {
    name: "lamp",
    category: ["home", "lighting", "lamps"],
    attributes: ["led", "dimmable", "usb port", "touch control", "modern", "wood base", "adjustable", "bedside"],
    options: { color: ["black", "white", "gold", "silver", "brown"] },
    price: [15, 90]
  },
  {
    name: "candle",
    category: ["home", "decor", "candles"],
    attributes: ["soy wax", "long lasting", "glass jar", "natural", "3 wick", "gift", "lead free", "aromatherapy"],
    options: {
      scent: ["lavender", "vanilla", "cedar", "citrus", "rose", "eucalyptus"],
      size: ["8 oz", "12 oz", "16 oz"]
    },
    price: [8, 40]
  },
  {
    name: "towel set",
    category: ["home", "bath", "towels"],
    attributes: ["cotton", "quick dry", "absorbent", "soft", "turkish", "bamboo", "oversized", "hotel quality"],
    options: { color: colors, pack: ["2 pack", "4 pack", "6 pack"] },
    price: [15, 70]
  },
  {
    name: "mug",
    category: ["kitchen", "drinkware", "mugs"],
    attributes: [
      "ceramic", "insulated", "stainless steel", "dishwasher safe", "microwave safe", "with lid", "travel", "handle"
    ],
    options: { size: ["12 oz", "16 oz", "20 oz"], color: colors },
    price: [8, 35]
  },
  {
    name: "water bottle",
    category: ["kitchen", "drinkware", "water bottles"],
    attributes: [
      "insulated", "stainless steel", "bpa free", "leak proof", "wide mouth", "straw lid", "lightweight",
      "dishwasher safe"
    ],
    options: { size: ["20 oz", "32 oz", "40 oz"], color: colors },
    price: [10, 45]
  },
  {
    name: "frying pan",
    category: ["kitchen", "cookware", "pans"],
    attributes: [
      "nonstick", "cast iron", "stainless steel", "induction compatible", "oven safe", "dishwasher safe", "with lid",
      "pfoa free"
    ],
    options: { size: ["8 inch", "10 inch", "12 inch"] },
    price: [15, 90]
  },
  {
    name: "storage bins",
    plural: true,
    category: ["home", "storage", "bins"],
    attributes: ["foldable", "fabric", "plastic", "stackable", "with lid", "handles", "clear", "large"],
    options: { color: ["grey", "beige", "white", "black", "navy"], pack: ["3 pack", "4 pack", "6 pack"] },
    price: [12, 50]
  },
  // Electronics
  {
    name: "headphones",
    plural: true,
    category: ["electronics", "audio", "headphones"],
    attributes: [
      "wireless", "noise cancelling", "bluetooth", "over ear", "foldable", "microphone", "long battery", "deep bass"
    ],
    options: { color: deviceColors },
    price: [20, 250]
  },
  {
    name: "earbuds",
    plural: true,
    category: ["electronics", "audio", "earbuds"],
    attributes: [
      "wireless", "bluetooth", "waterproof", "charging case", "noise cancelling", "sport", "touch control",
      "microphone"
    ],
    options: { color: deviceColors },
    price: [15, 180]
  },
  {
    name: "speaker",
    category: ["electronics", "audio", "speakers"],
    attributes: ["bluetooth", "portable", "waterproof", "wireless", "deep bass", "long battery", "outdoor", "loud"],
    options: { color: deviceColors },
    price: [20, 200]
  },
  {
    name: "phone case",
    category: ["electronics", "phone accessories", "cases"],
    attributes: ["shockproof", "slim", "clear", "magnetic", "kickstand", "wallet", "silicone", "card holder"],
    options: {
      model: ["iphone 14", "iphone 15", "iphone 16", "galaxy s23", "galaxy s24", "pixel 8"],
      color: deviceColors
    },
    price: [8, 40]
  },
  {
    name: "charger",
    category: ["electronics", "phone accessories", "chargers"],
    attributes: ["fast charging", "usb c", "wall plug", "dual port", "foldable", "compact", "gan", "travel"],
    options: { color: ["black", "white"], pack: ["1 pack", "2 pack", "3 pack"] },
    price: [10, 50]
  },
  {
    name: "usb cable",
    category: ["electronics", "phone accessories", "cables"],
    attributes: ["usb c", "braided", "fast charging", "lightning", "durable", "nylon", "data sync", "right angle"],
    options: { length: ["3 ft", "6 ft", "10 ft"], color: ["black", "white", "grey", "red"] },
    price: [6, 25]
  },
  {
    name: "power bank",
    category: ["electronics", "phone accessories", "power banks"],
    attributes: ["portable", "fast charging", "usb c", "slim", "wireless", "compact", "led display", "dual output"],
    options: { capacity: ["5000mah", "10000mah", "20000mah"], color: deviceColors },
    price: [15, 70]
  },
  {
    name: "keyboard",
    category: ["electronics", "computer accessories", "keyboards"],
    attributes: ["wireless", "mechanical", "backlit", "ergonomic", "bluetooth", "compact", "quiet", "rechargeable"],
    options: { color: deviceColors },
    price: [20, 150]
  },
  {
    name: "mouse",
    category: ["electronics", "computer accessories", "mice"],
    attributes: ["wireless", "ergonomic", "bluetooth", "silent", "rechargeable", "gaming", "vertical", "usb receiver"],
    options: { color: deviceColors },
    price: [10, 80]
  },
  {
    name: "smart watch",
    category: ["electronics", "wearables", "smart watches"],
    attributes: [
      "fitness tracker", "heart rate", "waterproof", "sleep monitor", "gps", "bluetooth", "long battery",
      "touch screen"
    ],
    options: { color: deviceColors },
    price: [30, 300]
  },
  // Beauty
  {
    name: "shampoo",
    category: ["beauty", "hair care", "shampoo"],
    attributes: [
      "sulfate free", "moisturizing", "argan oil", "for dry hair", "natural", "volumizing", "paraben free",
      "anti dandruff"
    ],
    options: { size: ["8 fl oz", "16 fl oz", "32 fl oz"] },
    price: [6, 35]
  },
  {
    name: "hair oil",
    category: ["beauty", "hair care", "hair oils"],
    attributes: [
      "argan oil", "for dry hair", "natural", "lightweight", "heat protection", "coconut", "frizz control", "shine"
    ],
    options: { size: ["2 fl oz", "4 fl oz", "8 fl oz"] },
    price: [8, 40]
  },
  {
    name: "face serum",
    category: ["beauty", "skin care", "serums"],
    attributes: [
      "vitamin c", "hyaluronic acid", "anti aging", "retinol", "for sensitive skin", "oil free", "brightening",
      "fragrance free"
    ],
    options: { size: ["1 fl oz", "2 fl oz"] },
    price: [10, 60]
  },
  {
    name: "body lotion",
    category: ["beauty", "skin care", "lotions"],
    attributes: [
      "unscented", "shea butter", "for dry skin", "non greasy", "fast absorbing", "natural", "cocoa butter",
      "for sensitive skin"
    ],
    options: { size: ["8 fl oz", "16 fl oz"], scent: ["lavender", "vanilla", "coconut", "original", "rose"] },
    price: [6, 30]
  },
  {
    name: "sunscreen",
    category: ["beauty", "skin care", "sunscreen"],
    attributes: [
      "spf 50", "water resistant", "mineral", "reef safe", "broad spectrum", "oil free", "fragrance free",
      "lightweight"
    ],
    options: { size: ["3 fl oz", "6 fl oz"] },
    price: [8, 35]
  },
  {
    name: "lipstick",
    category: ["beauty", "makeup", "lipstick"],
    attributes: ["matte", "long lasting", "moisturizing", "waterproof", "cruelty free", "vegan", "glossy", "creamy"],
    options: { color: ["red", "nude", "pink", "berry", "coral", "plum"] },
    price: [5, 40]
  },
  {
    name: "nail polish",
    category: ["beauty", "makeup", "nail polish"],
    attributes: ["quick dry", "long lasting", "gel", "non toxic", "glossy", "chip resistant", "vegan", "matte"],
    options: { color: ["red", "nude", "pink", "black", "coral", "blue"] },
    price: [4, 20]
  },
  // Grocery
  {
    name: "coffee",
    category: ["grocery", "beverages", "coffee"],
    attributes: [
      "whole bean|ground", "dark roast|medium roast", "organic", "decaf", "single origin", "fair trade", "arabica",
      "low acid"
    ],
    options: { size: ["12 oz", "2 lb"], flavor: ["vanilla", "hazelnut", "caramel", "original", "mocha"] },
    price: [8, 40]
  },
  {
    name: "tea",
    category: ["grocery", "beverages", "tea"],
    attributes: [
      "green|black|herbal", "organic", "decaf", "loose leaf", "caffeine free", "matcha", "sugar free",
      "individually wrapped"
    ],
    options: {
      flavor: ["mint", "lemon", "peach", "original", "chai", "ginger"],
      pack: ["20 bags", "50 bags", "100 bags"]
    },
    price: [4, 30]
  },
  {
    name: "snack bars",
    plural: true,
    category: ["grocery", "snacks", "bars"],
    attributes: ["protein", "gluten free", "low sugar", "keto", "vegan", "high fiber", "nut free", "organic"],
    options: {
      flavor: ["chocolate", "peanut butter", "vanilla", "berry", "almond"],
      pack: ["6 pack", "12 pack", "24 pack"]
    },
    price: [6, 40]
  },
  {
    name: "olive oil",
    category: ["grocery", "pantry", "oils"],
    attributes: [
      "extra virgin", "cold pressed", "organic", "first press", "imported", "non gmo", "italian", "unfiltered"
    ],
    options: { size: ["500 ml", "1 l", "3 l"] },
    price: [8, 50]
  },
  {
    name: "honey",
    category: ["grocery", "pantry", "honey"],
    attributes: ["raw", "organic", "unfiltered", "manuka", "pure", "local", "creamed", "wildflower"],
    options: { size: ["12 oz", "16 oz", "32 oz"] },
    price: [6, 45]
  },
  {
    name: "protein powder",
    category: ["grocery", "nutrition", "protein"],
    attributes: ["whey", "plant based", "low sugar", "gluten free", "keto", "non gmo", "grass fed", "vegan"],
    options: {
      flavor: ["chocolate", "vanilla", "strawberry", "unflavored", "cookies and cream"],
      size: ["1 lb", "2 lb", "5 lb"]
    },
    price: [15, 80]
  },
  // Sports
  {
    name: "yoga mat",
    category: ["sports", "fitness", "yoga"],
    attributes: [
      "non slip", "extra thick", "eco friendly", "carrying strap", "lightweight", "foldable", "cushioned", "tpe"
    ],
    options: { color: colors },
    price: [12, 60]
  },
  {
    name: "backpack",
    category: ["sports", "outdoors", "backpacks"],
    attributes: [
      "waterproof", "laptop sleeve", "lightweight", "anti theft", "usb charging port", "hiking", "large capacity",
      "padded straps"
    ],
    options: { color: colors },
    price: [20, 100]
  },
  {
    name: "dumbbells",
    plural: true,
    category: ["sports", "fitness", "weights"],
    attributes: ["adjustable", "rubber coated", "non slip", "hex", "neoprene", "pair", "compact", "chrome"],
    options: { weight: ["5 lb", "10 lb", "15 lb", "20 lb", "25 lb"] },
    price: [15, 150]
  }
]

/**
 * Brand names (title case in titles).
 *
 * @category constants
 * @since 0.1.0
 */
export const brands: ReadonlyArray<string> = [
  "Acme", "Zeta", "Nova", "Orbit", "Lumen", "Vela", "Kiro", "Pico", "Terra", "Mira", "Brio", "Cora", "Dune", "Echo",
  "Fable", "Gala", "Halo", "Iris", "Juno", "Koa", "Lark", "Moss", "Nimbus", "Onyx", "Pax", "Quill", "Rho", "Sol",
  "Tide", "Umbra"
]
