// Parse TraceQL queries with Grafana's own grammar (@grafana/lezer-traceql on @lezer/lr).
// Usage: node traceql_parse.mjs <dir holding node_modules>  < queries.json
// stdin: JSON array of query strings. stdout: JSON array of {query, ok, errors}, where ok
// means the parse tree has no error node; errors lists [from, to] of each error node.
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modulesDir = process.argv[2];
if (!modulesDir) {
  console.error("usage: node traceql_parse.mjs <dir with node_modules>");
  process.exit(2);
}
const require = createRequire(join(modulesDir, "package.json"));
const { parser } = await import(pathToFileURL(require.resolve("@grafana/lezer-traceql")).href);

const queries = JSON.parse(readFileSync(0, "utf8"));
const results = queries.map((query) => {
  const tree = parser.parse(query);
  const errors = [];
  tree.iterate({
    enter(node) {
      if (node.type.isError) errors.push([node.from, node.to]);
    },
  });
  return { query, ok: errors.length === 0 && tree.length === query.length, errors };
});
process.stdout.write(JSON.stringify(results));
