// tests/tokenizer/jinja_js.mjs NODE_MODULES CASES.json: render each case
// ({"template": path, "context": {...}}) with @huggingface/jinja (the engine
// transformers.js uses) and print a JSON array of {"out": text} or
// {"error": message}; the second oracle of jinja_oracle.py.  raise_exception
// and strftime_now are its own (the templates compared do not call strftime_now).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [nm, casesPath] = process.argv.slice(2);
const dir = join(nm, "@huggingface/jinja");
const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
let entry = pkg.exports && pkg.exports["."] ? pkg.exports["."] : pkg.module || pkg.main;
if (typeof entry === "object") entry = entry.import || entry.default;
if (typeof entry === "object") entry = entry.default;
const { Template } = await import(pathToFileURL(join(dir, entry)).href);
const cache = new Map();
const res = JSON.parse(readFileSync(casesPath, "utf8")).map((c) => {
	try {
		if (!cache.has(c.template)) cache.set(c.template, new Template(readFileSync(c.template, "utf8")));
		return { out: cache.get(c.template).render(c.context) };
	} catch (e) {
		return { error: String(e.message) };
	}
});
process.stdout.write(JSON.stringify(res));
