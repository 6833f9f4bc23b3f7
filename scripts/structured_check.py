"""Issue 63's correctness row: 50 held-out-style prompts, each with its own JSON schema; every
output parses and validates (the `jsonschema` package), and speculative constrained greedy
output is token-identical to plain constrained greedy decoding (method ar) where the target
scores exactly (`--exact on`, the default; docs/exact.md).

    PYTHONPATH=$PWD python scripts/structured_check.py --out benchmarks/results/NAME
    PYTHONPATH=$PWD python scripts/structured_check.py --limit 3 --target-backend llamacpp --out /tmp/try

The prompts are everyday and coding tasks written for this check (no benchmark's): extract a
bug report, describe a function signature, a recipe, a config, a calendar event, test cases...
Each is one chat message that shows its schema, so the model knows the fields. Per prompt,
method ar first (the reference), then each of --methods, greedy, the same --max-tokens. An
output cut by --max-tokens (finish reason "length") counts as one that does not parse. Writes
results.json and README.md to --out; exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from importlib import metadata
from pathlib import Path

import jsonschema

from anydraft import Decoder
from anydraft.config import check_method
from anydraft.constraints import Grammar
from anydraft.constraints.grammar import GRAMMAR_METHODS
from anydraft.errors import AnydraftError
from anydraft.hardware import this_machine
from anydraft.options import EXACT_CHOICES

# `anydraft demo`'s pair (anydraft/cli.py): the catalog's default target and drafter
TARGET, DRAFTER = "qwen2.5-coder-0.5b", "smollm2-135m"
VERSIONS = ("anydraft", "torch", "transformers", "llama_cpp_python", "ik-llama-cpp-python", "llguidance",
            "jsonschema")
# what `jsonschema` checks of "format" here (others, e.g. date-time, time, hostname, uri, pass
# unchecked on its side; llguidance still holds the output to them)
FORMAT_CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER
# where a generation's seconds went (decoding/stats.py): the prompt read (part of the target's
# calls), the target's calls, the drafter's, anydraft's own work (the last three sum to the whole)
PHASES = ("prefill_seconds", "target_seconds", "drafter_model_seconds", "host_seconds")
PROMPT = "{task}{text}\n\nAnswer with one JSON object that follows this JSON schema:\n{schema}"


# -- schema builders: every free string has a maxLength, so an answer fits --max-tokens ----------
def obj(required: dict, optional: dict | None = None, closed: bool = True) -> dict:
    schema = {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required)}
    if closed:
        schema["additionalProperties"] = False
    return schema


def text(max_length: int = 40) -> dict:
    return {"type": "string", "maxLength": max_length}


def pattern(regex: str, max_length: int | None = None) -> dict:
    return {"type": "string", "pattern": regex} | ({"maxLength": max_length} if max_length else {})


def fmt(name: str) -> dict:
    return {"type": "string", "format": name}


def integer(minimum: int | None = None, maximum: int | None = None) -> dict:
    return _bounded("integer", minimum, maximum)


def number(minimum: float | None = None, maximum: float | None = None) -> dict:
    return _bounded("number", minimum, maximum)


def _bounded(kind: str, minimum, maximum) -> dict:
    schema = {"type": kind}
    if minimum is not None:
        schema["minimum"] = minimum
    if maximum is not None:
        schema["maximum"] = maximum
    return schema


def enum(*values) -> dict:
    return {"enum": list(values)}


def array(items: dict, min_items: int = 0, max_items: int | None = None) -> dict:
    schema = {"type": "array", "items": items}
    if min_items:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    return schema


BOOL = {"type": "boolean"}
HHMM = pattern(r"^([01][0-9]|2[0-3]):[0-5][0-9]$")
SEMVER = pattern(r"^[0-9]+\.[0-9]+\.[0-9]+$")
WEEKDAYS = enum("mon", "tue", "wed", "thu", "fri", "sat", "sun")

# (id, task, input text or "", schema): 50 prompts, each with its own schema
CASES = [
    ("bug-crash-signin", "Extract the fields of this bug report.",
     "Since updating to 3.4.1 yesterday, the Android app crashes every time I tap 'Sign in with Google'. "
     "It works fine on the web. I'm on a Pixel 7 with Android 14. This blocks all our field staff from "
     "logging in, so please treat it as urgent.",
     obj({"title": text(60), "version": SEMVER, "platform": enum("android", "ios", "web", "desktop"),
          "severity": enum("low", "medium", "high", "critical"), "steps": array(text(80), 1, 4)},
         {"device": text(40)})),
    ("bug-csv-export", "Turn this bug report into a structured ticket.",
     "Exporting a report to CSV drops every row after the 1000th. Steps: open Reports, choose 'All "
     "orders', click Export > CSV. Expected 4,210 rows, got 1,000. Happens in Firefox and Chrome on "
     "version 2.9.0 of the dashboard. Not a blocker, we can export in pages.",
     obj({"summary": text(80), "component": enum("reports", "auth", "billing", "search", "settings"),
          "expected_rows": integer(0), "actual_rows": integer(0),
          "browsers": array(enum("chrome", "firefox", "safari", "edge"), 1, 4), "blocker": BOOL})),
    ("signature-python", "Describe this Python function's signature.",
     "def retry(fn, attempts: int = 3, delay: float = 0.5, exceptions: tuple = (Exception,)) -> Any:\n"
     "    # calls fn until it succeeds or the attempts run out, sleeping `delay` seconds between tries",
     {"$defs": {"param": obj({"name": text(30), "type": text(30)}, {"default": text(30)})},
      **obj({"name": text(40), "parameters": array({"$ref": "#/$defs/param"}, 1, 6),
             "returns": text(30), "is_async": BOOL})}),
    ("signature-typescript", "Describe this function's signature.",
     "export async function fetchUser(id: string, opts?: { cache?: boolean }): Promise<User | null>\n"
     "// looks a user up by id; null when there is none",
     obj({"name": text(40), "language": enum("typescript", "javascript", "python", "go", "rust"),
          "async": BOOL, "params": array(obj({"name": text(20), "type": text(40), "optional": BOOL}), 1, 4),
          "return_type": text(40)})),
    ("recipe-pancakes", "Write a simple recipe for pancakes.", "",
     obj({"title": text(50), "servings": integer(1, 12), "prep_minutes": integer(1, 120),
          "ingredients": array(obj({"item": text(30), "quantity": number(0, 1000),
                                    "unit": enum("g", "ml", "tsp", "tbsp", "cup", "piece")}), 3, 5),
          "steps": array(text(80), 2, 4)}, {"vegetarian": BOOL})),
    ("recipe-from-note", "Extract the recipe from this note.",
     "Grandma's tomato soup: fry one chopped onion in 2 tbsp olive oil for 5 minutes, add 800 g canned "
     "tomatoes and 500 ml stock, simmer 20 minutes, blend, season with salt. Serves 4.",
     obj({"name": text(40), "servings": integer(1, 20), "total_minutes": integer(1, 300),
          "ingredients": array(text(40), 2, 8), "diet": enum("vegan", "vegetarian", "pescatarian", "omnivore")})),
    ("config-web-server", "Write the configuration of this web server.",
     "Listen on port 8443 with TLS, serve /var/www/site, 4 worker processes, gzip on, log level warn, "
     "and allow only the hosts example.org and www.example.org.",
     obj({"port": integer(1, 65535), "tls": BOOL, "root": pattern(r"^/[A-Za-z0-9_./-]*$", 60),
          "workers": integer(1, 64), "gzip": BOOL, "log_level": enum("debug", "info", "warn", "error"),
          "allowed_hosts": array(fmt("hostname"), 1, 5)})),
    ("config-database", "Fill in a database connection config from this description.",
     "Postgres on db.internal at port 5432, database 'orders', user 'app', a pool of 10 to 30 "
     "connections, a 5-second connect timeout, SSL required.",
     obj({"driver": enum("postgres", "mysql", "sqlite"), "host": text(40), "port": integer(1, 65535),
          "database": text(30), "user": text(30), "pool": obj({"min": integer(0, 100), "max": integer(1, 1000)}),
          "timeout_seconds": number(0, 60), "ssl": BOOL}, {"password": text(40)})),
    ("calendar-retro", "Create a calendar event from this message.",
     "Team retro on Thursday 14 March 2024, from 15:00 to 16:00 in room Atlas; invite Priya, Tom and "
     "Lena. Remind us 15 minutes before.",
     obj({"title": text(40), "date": fmt("date"), "start": HHMM, "end": HHMM, "location": text(30),
          "attendees": array(text(30), 1, 10), "reminder_minutes": integer(0, 1440)})),
    ("calendar-recurring", "Create a recurring calendar event from this message.",
     "Yoga every Monday and Wednesday at 7am, an hour each, from 2024-04-01 until the end of June 2024.",
     obj({"title": text(40), "days": array(WEEKDAYS, 1, 7), "start_time": HHMM,
          "duration_minutes": integer(5, 480), "first_date": fmt("date"), "last_date": fmt("date")})),
    ("tests-leap-year", "List test cases for this function.",
     "is_leap_year(year: int) -> bool: true for years divisible by 4, except centuries, unless they "
     "are divisible by 400.",
     obj({"function": text(40), "cases": array(obj({"input": integer(1, 9999), "expected": BOOL,
                                                    "why": text(60)}), 3, 6)})),
    ("tests-slugify", "List test cases for this function.",
     "slugify(title: str) -> str: lowercases, replaces each run of non-alphanumeric characters with one "
     "hyphen, and trims hyphens at both ends.",
     obj({"function": text(40), "cases": array(obj({"input": text(40), "expected": pattern(r"^[a-z0-9-]*$", 40)}), 3, 5),
          "covers": array(enum("empty", "unicode", "punctuation", "whitespace", "already_slug"), 1, 5)})),
    ("contact-signature", "Extract the contact details from this email signature.",
     "Best, Dr. Amara Okafor | Head of Data, Lumen Health | amara.okafor@lumenhealth.io | "
     "+44 20 7946 0958 | London",
     obj({"name": text(40), "title": text(40), "company": text(40), "email": fmt("email"),
          "phone": pattern(r"^\+?[0-9 ()-]{7,20}$"), "city": text(30)}, {"website": text(60)})),
    ("shopping-list", "Turn this note into a shopping list.",
     "need 2 litres of milk, a dozen eggs, 500g spaghetti, some basil, 3 lemons and dish soap",
     obj({"items": array(obj({"name": text(30), "quantity": number(0, 100),
                              "unit": enum("l", "g", "kg", "piece", "bunch", "bottle", "none"),
                              "aisle": enum("dairy", "produce", "pantry", "household", "other")}), 1, 8)})),
    ("expense-taxi", "Record this expense.",
     "Taxi from the airport to the hotel on 2024-05-17, 42.50 EUR, paid with the company card, for the "
     "Berlin conference.",
     obj({"date": fmt("date"), "amount": number(0, 100000), "currency": pattern(r"^[A-Z]{3}$"),
          "category": enum("travel", "meals", "lodging", "supplies", "other"), "reimbursable": BOOL,
          "note": text(80)})),
    ("commit-message", "Write a conventional commit for this change.",
     "Fixed the off-by-one in paginate() that skipped the last item on every page; added a regression test.",
     obj({"type": enum("feat", "fix", "docs", "refactor", "test", "chore"), "scope": text(20),
          "subject": text(60), "breaking": BOOL}, {"body": text(200)})),
    ("requirements-file", "List the dependencies in this requirements file.",
     "requests>=2.31\nnumpy==1.26.4\n# dev only\npytest~=8.0\nrich",
     obj({"packages": array(obj({"name": pattern(r"^[A-Za-z0-9_.-]+$", 40), "specifier": text(20),
                                 "dev": BOOL}), 1, 8)})),
    ("curl-request", "Describe the HTTP request this curl command makes.",
     "curl -X POST https://api.example.com/v2/orders -H 'Content-Type: application/json' "
     "-H 'Authorization: Bearer abc123' -d '{\"sku\": \"A-17\", \"qty\": 2}'",
     obj({"method": enum("GET", "POST", "PUT", "PATCH", "DELETE"), "url": fmt("uri"),
          "headers": array(obj({"name": text(30), "value": text(60)}), 0, 6), "has_body": BOOL})),
    ("log-line", "Parse this log line.",
     "2024-06-02T08:15:27Z ERROR [payment-service] Timeout after 3000 ms calling bank API (attempt 2/3)",
     obj({"timestamp": fmt("date-time"), "level": enum("DEBUG", "INFO", "WARN", "ERROR"),
          "service": text(40), "message": text(100), "duration_ms": integer(0),
          "attempt": integer(1, 10), "max_attempts": integer(1, 10)})),
    ("sql-table", "Design a database table for this.",
     "We need to store blog comments: who wrote it, which post, the text, when, and whether a moderator "
     "approved it.",
     obj({"table": pattern(r"^[a-z_]+$", 30),
          "columns": array(obj({"name": pattern(r"^[a-z_]+$", 30),
                                "type": enum("integer", "bigint", "text", "varchar", "boolean", "timestamp"),
                                "nullable": BOOL}, {"primary_key": BOOL}), 3, 8)})),
    ("api-error", "Write the API's error response for this situation.",
     "A user tried to upload a 30 MB avatar; the limit is 5 MB.",
     obj({"status": integer(400, 599), "code": enum("too_large", "bad_request", "unauthorized", "rate_limited"),
          "message": text(100),
          "details": {"anyOf": [obj({"limit_bytes": integer(0), "received_bytes": integer(0)}), {"type": "null"}]}})),
    ("book-review", "Summarize this book review.",
     "I wanted to love 'The Quiet Orbit' - the premise of a lighthouse keeper on a space station is "
     "wonderful - but the middle third drags and the ending felt rushed. Still, the prose is lovely. "
     "Three stars.",
     obj({"title": text(40), "rating": integer(1, 5), "sentiment": enum("positive", "mixed", "negative"),
          "pros": array(text(60), 0, 3), "cons": array(text(60), 0, 3)})),
    ("trip-lisbon", "Plan a two-day trip to Lisbon.", "",
     obj({"city": text(30), "days": array(obj({"day": integer(1, 2), "activities": array(text(60), 1, 3)}), 2, 2),
          "budget_eur": number(0, 5000), "needs_car": BOOL})),
    ("meeting-actions", "Extract the decisions and action items from these meeting notes.",
     "Notes 3/7: Dana will update the onboarding doc by Friday. Raj to check the flaky CI job. We agreed "
     "to drop IE11 support. Mei follows up with legal about the license (no date).",
     obj({"decisions": array(text(80), 0, 3),
          "actions": array(obj({"owner": text(20), "task": text(80)}, {"due": text(20)}), 1, 5)})),
    ("support-triage", "Classify these three support tickets.",
     "1) 'I was charged twice for my subscription.' 2) 'How do I export my data?' "
     "3) 'The app freezes on the settings page.'",
     obj({"tickets": array(obj({"id": integer(1, 3), "category": enum("billing", "how_to", "bug", "feature_request"),
                                "priority": enum("low", "normal", "high")}), 3, 3)})),
    ("regex-explain", "Explain this regular expression.", r"^\d{3}-\d{2}-\d{4}$",
     obj({"matches": text(80), "examples_matching": array(text(20), 1, 3),
          "examples_not_matching": array(text(20), 1, 3), "anchored": BOOL})),
    ("cli-usage", "Describe the command line of this tool from its usage line.",
     "usage: backup [-h] [--dry-run] [--keep N] [--exclude PATTERN ...] SOURCE DEST",
     obj({"program": text(20), "positional": array(text(20), 0, 4),
          "options": array(obj({"flag": pattern(r"^--?[a-z][a-z-]*$", 30), "takes_value": BOOL}), 1, 6)})),
    ("unit-conversion", "Convert these measurements to metric units.",
     "5 feet 11 inches tall, 172 pounds, and a 26.2-mile run.",
     obj({"height_cm": number(50, 250), "weight_kg": number(20, 300), "distance_km": number(0, 100)})),
    ("product-laptop", "Write a product listing for a refurbished laptop.", "",
     obj({"name": text(50), "price": number(0, 10000), "currency": enum("USD", "EUR", "GBP"),
          "condition": enum("new", "refurbished", "used"),
          "specs": obj({"ram_gb": integer(1, 256), "storage_gb": integer(32, 8192), "screen_inches": number(10, 18)}),
          "in_stock": BOOL}, {"warranty_months": integer(0, 60)})),
    ("code-review", "Review this Python snippet and report its issues.",
     "def avg(xs):\n    return sum(xs) / len(xs)\n\nresult = avg([])",
     obj({"issues": array(obj({"line": integer(1, 10), "severity": enum("info", "warning", "error"),
                               "message": text(80)}), 1, 3), "fixed_code": text(200)})),
    ("weather-oslo", "Extract the forecast from this text.",
     "Tomorrow in Oslo: light snow in the morning, clearing later, a high of -2 °C and a low of -9 °C, "
     "wind 20 km/h from the north, 60% chance of precipitation.",
     obj({"city": text(30), "conditions": array(enum("sunny", "cloudy", "rain", "snow", "fog", "wind", "clear"), 1, 3),
          "high_c": number(-60, 60), "low_c": number(-60, 60), "wind_kmh": integer(0, 300),
          "wind_direction": enum("N", "NE", "E", "SE", "S", "SW", "W", "NW"),
          "precipitation_chance": number(0, 1)})),
    ("job-posting", "Extract the details of this job posting.",
     "We're hiring a remote Senior Backend Engineer (Go, PostgreSQL, Kubernetes) for our payments team. "
     "80-100k EUR, full-time, at least 5 years of experience.",
     obj({"role": text(50), "seniority": enum("junior", "mid", "senior", "lead"), "remote": BOOL,
          "skills": array(text(20), 1, 6),
          "salary": obj({"min": integer(0), "max": integer(0), "currency": pattern(r"^[A-Z]{3}$")}),
          "employment": enum("full_time", "part_time", "contract"), "min_years": integer(0, 40)})),
    ("dockerfile", "Summarize this Dockerfile.",
     "FROM python:3.12-slim\nWORKDIR /app\nCOPY requirements.txt .\nRUN pip install -r requirements.txt\n"
     "COPY . .\nEXPOSE 8000\nCMD [\"gunicorn\", \"app:app\", \"-b\", \"0.0.0.0:8000\"]",
     obj({"base_image": text(40), "workdir": text(30), "exposed_ports": array(integer(1, 65535), 0, 4),
          "command": array(text(30), 1, 6), "installs_requirements": BOOL})),
    ("todo-email", "Turn this email into to-do items.",
     "Hi! Before the move on Saturday could you book the van, cancel the internet at the old flat, and "
     "pick up the spare keys from Anna? Also don't forget to water the plants.",
     obj({"todos": array(obj({"task": text(60), "done": BOOL, "priority": integer(1, 3)}), 1, 6),
          "deadline": {"type": ["string", "null"], "maxLength": 30}})),
    ("changelog", "Write the changelog entry of release 1.8.0.",
     "New: dark mode, CSV import. Fixed: a crash when the window is resized to zero width; wrong totals "
     "with negative discounts. Removed: the legacy XML export.",
     obj({"version": SEMVER, "added": array(text(60), 0, 5), "fixed": array(text(60), 0, 5),
          "removed": array(text(60), 0, 5), "breaking": BOOL})),
    ("address", "Parse this postal address.", "Flat 3B, 27 Rosemary Lane, Bristol BS1 4QT, United Kingdom",
     obj({"street_number": text(10), "street": text(40), "city": text(30), "postcode": text(12),
          "country_code": pattern(r"^[A-Z]{2}$")}, {"unit": text(20)}, closed=False)),
    ("nutrition-label", "Read this nutrition label.",
     "Per 100 g: energy 1580 kJ / 377 kcal, fat 9.1 g (of which saturates 1.2 g), carbohydrate 58 g, "
     "sugars 3.4 g, fibre 7.8 g, protein 13 g, salt 0.02 g.",
     obj({"per_grams": integer(1, 1000), "kcal": integer(0, 1000),
          **{k: number(0, 100) for k in ("fat_g", "saturates_g", "carbs_g", "sugars_g", "fibre_g",
                                         "protein_g", "salt_g")}})),
    ("flight-booking", "Extract the booking from this confirmation.",
     "Your flight LH 2034 from Munich (MUC) to Lisbon (LIS) departs 2024-09-12 at 07:35, seat 14C, "
     "economy, 1 checked bag. Booking reference QX7T2P.",
     obj({"flight": pattern(r"^[A-Z0-9]{2} ?[0-9]{1,4}$"), "from": pattern(r"^[A-Z]{3}$"),
          "to": pattern(r"^[A-Z]{3}$"), "date": fmt("date"), "departure": HHMM,
          "seat": pattern(r"^[0-9]{1,2}[A-K]$"), "cabin": enum("economy", "premium", "business", "first"),
          "checked_bags": integer(0, 5), "reference": pattern(r"^[A-Z0-9]{6}$")})),
    ("feature-flag", "Write the feature flag settings for this rollout.",
     "Turn on the new checkout for 10% of users in Germany and Austria, only on the web, and keep it off "
     "for enterprise accounts.",
     obj({"flag": pattern(r"^[a-z][a-z0-9_]*$", 40), "enabled": BOOL, "rollout_percent": integer(0, 100),
          "countries": array(pattern(r"^[A-Z]{2}$"), 0, 10), "platforms": array(enum("web", "ios", "android"), 1, 3),
          "exclude_plans": array(enum("free", "pro", "enterprise"), 0, 3)})),
    ("cron", "Describe this cron schedule.", "30 2 * * 1-5",
     obj({"minute": integer(0, 59), "hour": integer(0, 23), "weekdays": array(WEEKDAYS, 1, 7),
          "every_day_of_month": BOOL, "description": text(80)})),
    ("pull-request", "Fill in a pull request summary for this change.",
     "Replaces the hand-rolled LRU cache in image_loader.py with functools.lru_cache, removes 120 lines, "
     "no behaviour change; the tests pass.",
     obj({"title": text(70), "files": array(text(60), 1, 5), "lines_added": integer(0),
          "lines_removed": integer(0), "behaviour_change": BOOL, "risk": enum("low", "medium", "high")})),
    ("env-vars", "List the environment variables this app needs, from this README excerpt.",
     "Set DATABASE_URL to your Postgres URL and SECRET_KEY to a random string. Optionally set LOG_LEVEL "
     "(default info) and PORT (default 8000).",
     obj({"variables": array(obj({"name": pattern(r"^[A-Z][A-Z0-9_]*$", 40), "required": BOOL},
                                 {"default": text(20)}), 1, 6)})),
    ("workout-log", "Log this workout.",
     "Did 3 sets of 8 squats at 60 kg, then 3x10 push-ups, then ran 5 km in 27 minutes.",
     obj({"exercises": array(obj({"name": text(30), "sets": integer(1, 10), "reps": integer(1, 100)},
                                 {"weight_kg": number(0, 500)}), 1, 5),
          "cardio": obj({"kind": enum("run", "bike", "swim", "row"), "distance_km": number(0, 200),
                         "minutes": integer(1, 600)})})),
    ("compare-libraries", "Compare two libraries for this task.",
     "Parsing command line arguments in Python: argparse or click?",
     {"$defs": {"option": obj({"name": text(20), "pros": array(text(50), 1, 3), "cons": array(text(50), 1, 3)})},
      **obj({"task": text(60), "options": array({"$ref": "#/$defs/option"}, 2, 2), "recommendation": text(30)})}),
    ("invoice-items", "Extract the invoice's line items.",
     "Invoice 2024-117 to Harbor Cafe: 3 hours of website maintenance at 60.00, 1 domain renewal at "
     "15.00, 2 hours of logo tweaks at 45.00. VAT 20%.",
     obj({"invoice_number": text(20), "customer": text(40),
          "items": array(obj({"description": text(40), "quantity": number(0, 1000),
                              "unit_price": number(0, 100000)}), 1, 6), "vat_rate": number(0, 1)})),
    ("git-recipe", "Which git commands do this?",
     "I committed to main by mistake: move my last two commits to a new branch called fix-typos and reset "
     "main to the remote.",
     obj({"steps": array(obj({"command": pattern(r"^git [a-z-]+.*$", 60), "explains": text(60)}), 2, 5),
          "destructive": BOOL})),
    ("color-palette", "Suggest a colour palette for a calm note-taking app.", "",
     obj({"name": text(30), "colors": array(obj({"role": enum("background", "surface", "primary", "accent", "text"),
                                                 "hex": pattern(r"^#[0-9a-fA-F]{6}$")}), 3, 5),
          "dark_mode": BOOL})),
    ("user-signup", "Create a user record for this sign-up.",
     "Signed up: Jonas Berg, jonas.berg@example.net, born 1990-02-14, prefers Swedish, declined marketing "
     "emails. Use the id 3f2b8c1e-9a4d-4e7b-8c2a-1d5e6f7a8b9c.",
     obj({"id": fmt("uuid"), "name": text(40), "email": fmt("email"), "birth_date": fmt("date"),
          "language": enum("en", "sv", "de", "fr", "es"), "marketing_opt_in": BOOL})),
    ("network-printer", "Extract the network settings from this note.",
     "The printer sits at 192.168.1.42 on VLAN 20, gateway 192.168.1.1, DNS 1.1.1.1 and 8.8.8.8, DHCP off.",
     obj({"ip": fmt("ipv4"), "vlan": integer(1, 4094), "gateway": fmt("ipv4"), "dns": array(fmt("ipv4"), 1, 3),
          "dhcp": BOOL})),
    ("quiz-question", "Write one multiple-choice quiz question about Python list comprehensions.", "",
     obj({"question": text(150), "choices": array(text(60), 4, 4), "answer_index": integer(0, 3),
          "difficulty": enum("easy", "medium", "hard")}, {"explanation": text(150)})),
]


def prompts() -> list[dict]:
    """{id, prompt, schema} of every case, its schema checked as Draft 2020-12."""
    assert len(CASES) == 50 and len({c[0] for c in CASES}) == 50, "50 cases, each its own id"
    out = []
    for case_id, task, body, schema in CASES:
        jsonschema.Draft202012Validator.check_schema(schema)
        prompt = PROMPT.format(task=task, text=f"\n\n{body}" if body else "", schema=json.dumps(schema))
        out.append({"id": case_id, "prompt": prompt, "schema": schema})
    assert len({p["prompt"] for p in out}) == len(out)
    return out


def check(out, schema: dict, max_tokens: int) -> dict:
    """One output's row: its tokens, speed, and whether it parses and validates (with why not)."""
    s = out.stats
    row = {"method": s["method"], "tokens": len(out.token_ids), "finish_reason": out.finish_reason,
           "seconds": round(s["seconds"], 3), "tok_s": round(s["tokens_per_s"], 2),
           "tokens_per_target_call": round(s["mean_accepted"], 3), "drafted": s["drafted"],
           "accepted": s["accepted"], **{k: round(s[k], 3) for k in PHASES}, "text": out.text,
           "token_ids": out.token_ids, "parsed": False, "valid": False, "error": None}
    if out.finish_reason == "length":
        row["error"] = f"cut at --max-tokens {max_tokens} (finish reason length)"
        return row
    try:
        value = json.loads(out.text)
    except ValueError as exc:
        row["error"] = f"does not parse (finish reason {out.finish_reason}): {exc}"
        return row
    row["parsed"] = True
    try:
        jsonschema.validate(value, schema, format_checker=FORMAT_CHECKER)
    except jsonschema.ValidationError as exc:
        where = "/".join(map(str, exc.absolute_path)) or "(root)"
        row["error"] = f"does not validate at {where}: {exc.message}"
        return row
    row["valid"] = True
    return row


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token sequences differ (the shorter one's length where one
    is the other's prefix); None where they are equal."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def versions() -> dict:
    found = {"python": sys.version.split()[0]}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def totals(rows: list[dict], methods: list[str]) -> dict:
    """Per method: prompts, parsed, validated, identical to ar (None for ar), tokens, tok/s over
    all its prompts, the seconds of each phase, tokens per target call."""
    out = {}
    for method in methods:
        runs = [r["runs"][method] for r in rows]
        tokens = sum(x["tokens"] for x in runs)
        seconds = sum(x["seconds"] for x in runs)
        calls = sum(x["tokens"] / x["tokens_per_target_call"] for x in runs if x["tokens_per_target_call"])
        out[method] = {"prompts": len(runs), "parsed": sum(x["parsed"] for x in runs),
                       "validated": sum(x["valid"] for x in runs),
                       "identical": None if method == "ar" else sum(x["identical"] for x in runs),
                       "tokens": tokens, "seconds": round(seconds, 3),
                       "tok_s": round(tokens / seconds, 2) if seconds else 0.0,
                       **{k: round(sum(x[k] for x in runs), 3) for k in PHASES},
                       "tokens_per_target_call": round(tokens / calls, 3) if calls else 0.0}
    return out


def failures(rows: list[dict], exact: bool) -> list[str]:
    """One line per failed check: the prompt, the method, what failed."""
    out = []
    for r in rows:
        for method, run in r["runs"].items():
            if run["error"]:
                out.append(f"{r['id']} {method}: {run['error']}")
            if exact and run.get("identical") is False:
                out.append(f"{r['id']} {method}: differs from ar at token {run['first_difference']} "
                           f"({run['tokens']} tokens against ar's {r['runs']['ar']['tokens']})")
    return out


def markdown(summary: dict) -> str:
    lines = ["# Structured outputs: JSON schemas, validity and greedy identity with ar", "",
             f"- command: `{summary['command']}`",
             *[f"- {line}" for line in summary["machine"]],
             f"- versions: {', '.join(f'{k} {v}' for k, v in summary['versions'].items())}",
             f"- target {summary['target']} ({summary['target_path']}), drafter "
             f"{summary['drafter']} ({summary['drafter_path']}); exact "
             f"{summary['exact']} (scoring exactly: {'yes' if summary['exact_scoring'] else 'no'})",
             f"- {summary['prompts']} prompts, each with its own JSON schema (scripts/structured_check.py), "
             f"greedy, chat template, at most {summary['max_tokens']} new tokens; an output cut there does "
             f"not parse. Validated with jsonschema (Draft 2020-12), formats checked: "
             f"{', '.join(summary['formats_checked'])}",
             "- identical: token ids equal to plain constrained decoding (method ar) of the same prompt", "",
             "| method | ran as | prompts | parsed | validated | identical to ar | tokens | tok/s | "
             "tokens per target call | seconds: prompt read / target (read included) / drafter / host |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, t in summary["totals"].items():
        ran = sorted({r["runs"][method]["method"] for r in summary["rows"]})
        same = "–" if t["identical"] is None else f"{t['identical']}/{t['prompts']}"
        lines.append(f"| {method} | {', '.join(ran)} | {t['prompts']} | {t['parsed']}/{t['prompts']} | "
                     f"{t['validated']}/{t['prompts']} | {same} | {t['tokens']} | {t['tok_s']:.1f} | "
                     f"{t['tokens_per_target_call']:.2f} | {' / '.join(f'{t[k]:.1f}' for k in PHASES)} |")
    lines += ["", f"Failed checks: {len(summary['failures'])}", *[f"- {f}" for f in summary["failures"]]]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--drafter", default=DRAFTER, help="a drafter model, or none")
    ap.add_argument("--target-backend", default="auto", help="auto | torch | llamacpp | ik (exact scoring: torch on a CPU, or llamacpp; "
                         "not ik, which auto may choose)")
    ap.add_argument("--drafter-backend", default=None, help="default: auto")
    ap.add_argument("--dtype", default="auto", help="the target's dtype on torch")
    ap.add_argument("--exact", default="on", choices=EXACT_CHOICES,
                    help="on (default): identity with ar is a check; auto: where the decoder chose it")
    ap.add_argument("--methods", default="auto", help="comma list, compared with ar (default auto)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    methods = [m for m in args.methods.split(",") if m and m != "ar"]
    try:
        for m in methods:
            check_method(m, has_drafter=args.drafter != "none")
            if m == "slrs":
                raise AnydraftError(GRAMMAR_METHODS)
    except AnydraftError as exc:
        ap.error(str(exc))
    cases = prompts()[:args.limit]
    progress = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    dec = Decoder(args.target, None if args.drafter == "none" else args.drafter, backend=args.target_backend,
                  drafter_backend=args.drafter_backend, dtype=args.dtype, exact=EXACT_CHOICES[args.exact],
                  progress=progress)
    exact = dec.target.exact
    # warm-up: the grammar engine's view of the tokenizer is built at the first constrained
    # request, and the first calls of each model read its weights
    for method in ["ar", *methods]:
        dec.generate("Say hi as JSON.", 8, method=method, grammar=Grammar("json_object"))
    rows = []
    for i, case in enumerate(cases, start=1):
        grammar = Grammar("json_schema", case["schema"])
        row = {"id": case["id"], "prompt_tokens": len(dec.prompt_ids(case["prompt"])), "runs": {}}
        reference = None
        for method in ["ar", *methods]:
            start = time.perf_counter()
            out = dec.generate(case["prompt"], args.max_tokens, method=method, grammar=grammar)
            run = check(out, case["schema"], args.max_tokens)
            run["wall_seconds"] = round(time.perf_counter() - start, 3)
            if reference is None:
                reference = out.token_ids
            else:
                run["first_difference"] = first_difference(reference, out.token_ids)
                run["identical"] = run["first_difference"] is None
            row["runs"][method] = run
            bad = run["error"] or ("differs from ar" if exact and run.get("identical") is False else "")
            progress(f"[{i}/{len(cases)}] {case['id']} {method} ({run['method']}): {run['tokens']} tokens, "
                     f"{run['tok_s']:.1f} tok/s, {'FAIL: ' + bad if bad else 'ok'}")
        rows.append(row)
    summary = {
        "command": "python scripts/structured_check.py " + shlex.join(sys.argv[1:]),
        "machine": this_machine().lines(), "versions": versions(),
        "target": args.target, "target_path": dec.target.path, "target_backend": dec.target.backend,
        "drafter": args.drafter, "drafter_path": dec.drafter.path if dec.drafter else None,
        "drafter_backend": dec.drafter.backend if dec.drafter else None,
        "exact": args.exact, "exact_scoring": exact, "max_tokens": args.max_tokens,
        "methods": ["ar", *methods], "prompts": len(cases), "formats_checked": sorted(FORMAT_CHECKER.checkers),
        "totals": totals(rows, ["ar", *methods]), "failures": failures(rows, exact), "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(summary, indent=1))
    (args.out / "README.md").write_text(markdown(summary))
    print(markdown(summary))
    return int(bool(summary["failures"]))


if __name__ == "__main__":
    sys.exit(main())
