"""The data of ``mlxbun evals run``'s built-in tasks, written for this project (no
download): small enough to run in a minute on a laptop, broad enough that a broken
quantization, template or grammar shows up as a drop against the same model's earlier row.

- ``mc``: a question and its choices; the answer is the choice index.
- ``gen``: a question and its one right short answer (few-shot, answered on one line).
- ``json``: a request and the JSON schema its reply must satisfy.
- ``tools``: a request and the tools on offer; the reply must call one with valid arguments.
"""

from __future__ import annotations

from typing import Any

MC: tuple[tuple[str, tuple[str, ...], int], ...] = (
    ("Question: What is the capital of France?\nAnswer:", ("Paris", "Berlin", "Madrid", "Rome"), 0),
    ("Question: How many legs does a spider have?\nAnswer:", ("six", "eight", "ten", "four"), 1),
    ("Question: Which planet is closest to the Sun?\nAnswer:",
     ("Venus", "Earth", "Mercury", "Mars"), 2),
    ("Question: What gas do plants take in from the air to make sugar?\nAnswer:",
     ("oxygen", "nitrogen", "helium", "carbon dioxide"), 3),
    ("Question: Water boils at sea level at how many degrees Celsius?\nAnswer:",
     ("100", "50", "0", "212"), 0),
    ("Question: Which is the largest ocean on Earth?\nAnswer:",
     ("the Atlantic", "the Pacific", "the Indian", "the Arctic"), 1),
    ("Question: What is 7 times 8?\nAnswer:", ("54", "48", "56", "64"), 2),
    ("Question: Who wrote Romeo and Juliet?\nAnswer:",
     ("Charles Dickens", "Jane Austen", "Mark Twain", "William Shakespeare"), 3),
    ("Question: What is frozen water called?\nAnswer:", ("ice", "steam", "sand", "glass"), 0),
    ("Question: Which animal is known as the king of the jungle?\nAnswer:",
     ("the elephant", "the lion", "the zebra", "the mouse"), 1),
    ("Question: How many days are in a week?\nAnswer:", ("five", "six", "seven", "eight"), 2),
    ("Question: What colour do you get by mixing blue and yellow?\nAnswer:",
     ("red", "purple", "orange", "green"), 3),
    ("Question: Which organ pumps blood through the body?\nAnswer:",
     ("the heart", "the lungs", "the liver", "the stomach"), 0),
    ("Question: In Python, which keyword defines a function?\nAnswer:",
     ("func", "def", "function", "lambda"), 1),
    ("Question: What is the chemical symbol for gold?\nAnswer:", ("Ag", "Gd", "Au", "Go"), 2),
    ("Question: Which continent is Egypt in?\nAnswer:", ("Asia", "Europe", "South America",
                                                         "Africa"), 3),
    ("Question: What does a thermometer measure?\nAnswer:",
     ("temperature", "weight", "speed", "distance"), 0),
    ("Question: How many sides does a hexagon have?\nAnswer:", ("five", "six", "seven", "eight"),
     1),
    ("Question: Which is a prime number?\nAnswer:", ("9", "15", "13", "21"), 2),
    ("Question: What do bees make?\nAnswer:", ("milk", "silk", "wax paper", "honey"), 3),
)

GEN_SHOTS = "Q: What is 2 plus 3?\nA: 5\nQ: What is the opposite of hot?\nA: cold\n"
GEN: tuple[tuple[str, str], ...] = (
    ("What is 4 plus 4?", "8"),
    ("What is 10 minus 3?", "7"),
    ("What is the opposite of up?", "down"),
    ("What is the opposite of day?", "night"),
    ("What is the capital of Italy?", "Rome"),
    ("What is the capital of Japan?", "Tokyo"),
    ("What colour is the sky on a clear day?", "blue"),
    ("How many hours are in a day?", "24"),
    ("What is the first letter of the English alphabet?", "A"),
    ("What is 3 times 3?", "9"),
    ("What is the plural of mouse?", "mice"),
    ("What is the past tense of go?", "went"),
)

JSON: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Describe a pet as JSON.",
     {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "fish"]},
                                       "indoor": {"type": "boolean"}},
      "required": ["kind", "indoor"], "additionalProperties": False}),
    ("Give a rating as JSON.",
     {"type": "object", "properties": {"stars": {"type": "integer", "minimum": 1, "maximum": 5},
                                       "verdict": {"enum": ["good", "bad"]}},
      "required": ["stars", "verdict"], "additionalProperties": False}),
    ("Name a colour as JSON.",
     {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
      "required": ["name"], "additionalProperties": False}),
    ("List up to three tags as JSON.",
     {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 3,
                                                "items": {"enum": ["a", "b", "c"]}}},
      "required": ["tags"], "additionalProperties": False}),
    ("Give a point as JSON.",
     {"type": "object", "properties": {"x": {"type": "integer", "minimum": -9, "maximum": 9},
                                       "y": {"type": "integer", "minimum": -9, "maximum": 9}},
      "required": ["x", "y"], "additionalProperties": False}),
    ("Answer yes or no as JSON.",
     {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                       "sure": {"type": "boolean"}},
      "required": ["answer"], "additionalProperties": False}),
)


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties,
                       "required": list(properties), "additionalProperties": False}}}


WEATHER = _tool("get_weather", "Current weather in a city",
                {"city": {"enum": ["Paris", "Rome", "Tokyo"]}})
TIMER = _tool("set_timer", "Start a countdown timer",
              {"minutes": {"type": "integer", "minimum": 1, "maximum": 60}})
NOTE = _tool("add_note", "Save a short note", {"text": {"type": "string", "maxLength": 20},
                                                "pinned": {"type": "boolean"}})
TOOLS: tuple[tuple[str, tuple[dict[str, Any], ...]], ...] = (
    ("What is the weather in Rome?", (WEATHER,)),
    ("Set a timer for ten minutes.", (TIMER,)),
    ("Remember to buy milk.", (NOTE,)),
    ("Is it raining in Tokyo?", (WEATHER, TIMER)),
    ("Start a five minute timer, please.", (WEATHER, TIMER, NOTE)),
)
