export default [{ rules: { "no-var": "error", "no-unused-vars": "warn", eqeqeq: "error" } }];
