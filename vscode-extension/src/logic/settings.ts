// The extension's settings as one typed object, and what the server receives.
// Pure: no `vscode` import, so node's test runner checks it directly.

export type RunOn = "save" | "open" | "manual";

/** The `fuselens.*` settings after defaults and validation. */
export interface FuselensSettings {
  interpreter: string[];
  runOn: RunOn;
  entry: string;
  backend: string;
  timeout: number;
  maxCalls: number;
  inlayHints: boolean;
}

/** What the server gets as `initializationOptions`: the settings plus trust. */
export interface InitializationOptions extends FuselensSettings {
  trusted: boolean;
  /** The workspace folder the settings were read for (file system path), "" when none. */
  workspaceFolder: string;
}

export const DEFAULT_SETTINGS: FuselensSettings = {
  interpreter: [],
  runOn: "save",
  entry: "",
  backend: "",
  timeout: 120,
  maxCalls: 3,
  inlayHints: true,
};

/** Setting names (below `fuselens.`) that the server reads. */
export const SETTING_KEYS = Object.keys(DEFAULT_SETTINGS) as (keyof FuselensSettings)[];

const RUN_ON: readonly string[] = ["save", "open", "manual"];

/** A settings reader: `get("runOn")` returns the raw configured value or undefined. */
export type SettingsReader = (key: string) => unknown;

/**
 * Reads every setting through `get` and replaces a missing or ill-typed value
 * with its default, so a hand-edited settings.json never reaches the server
 * as e.g. `timeout: "10"`.
 */
export function readSettings(get: SettingsReader): FuselensSettings {
  const interpreter = get("interpreter");
  const runOn = get("runOn");
  const timeout = get("timeout");
  const maxCalls = get("maxCalls");
  return {
    interpreter: normaliseInterpreter(interpreter),
    runOn: typeof runOn === "string" && RUN_ON.includes(runOn) ? (runOn as RunOn) : DEFAULT_SETTINGS.runOn,
    entry: stringOr(get("entry"), DEFAULT_SETTINGS.entry).trim(),
    backend: stringOr(get("backend"), DEFAULT_SETTINGS.backend).trim(),
    timeout: typeof timeout === "number" && timeout > 0 && Number.isFinite(timeout) ? timeout : DEFAULT_SETTINGS.timeout,
    maxCalls:
      typeof maxCalls === "number" && maxCalls >= 0 && Number.isInteger(maxCalls) ? maxCalls : DEFAULT_SETTINGS.maxCalls,
    inlayHints: typeof get("inlayHints") === "boolean" ? (get("inlayHints") as boolean) : DEFAULT_SETTINGS.inlayHints,
  };
}

/** `"python3"` and `["python3", "-X", "dev"]` are both accepted; blanks dropped. */
export function normaliseInterpreter(value: unknown): string[] {
  if (typeof value === "string") {
    return value.trim() ? [value.trim()] : [];
  }
  if (Array.isArray(value)) {
    return value.filter((v): v is string => typeof v === "string" && v.trim() !== "").map((v) => v.trim());
  }
  return [];
}

/** The server's initializationOptions: `{trusted, ...settings}`. */
export function initializationOptions(
  settings: FuselensSettings,
  trusted: boolean,
  workspaceFolder: string,
): InitializationOptions {
  return { ...settings, trusted, workspaceFolder };
}

export type SettingsChangeAction = "restart" | "none";

/**
 * What a configuration change needs. Every server setting travels in
 * initializationOptions, which a server reads once, so any change restarts
 * it (a restart is cheap: the server never imports torch). Trace settings are
 * handled by the language client itself.
 */
export function settingsChangeAction(affects: (section: string) => boolean): SettingsChangeAction {
  return SETTING_KEYS.some((key) => affects(`fuselens.${key}`)) ? "restart" : "none";
}

function stringOr(value: unknown, fallback: string): string {
  return typeof value === "string" ? value : fallback;
}

/**
 * A `workspace/configuration` answer with `trusted` set from workspace
 * trust: for the "fuselens" section (and the whole configuration) only.
 */
export function enforceTrust(section: string | undefined, value: unknown, trusted: boolean): unknown {
  if (section === "fuselens" && value && typeof value === "object" && !Array.isArray(value)) {
    return { ...(value as Record<string, unknown>), trusted };
  }
  if ((section === undefined || section === "") && value && typeof value === "object" && !Array.isArray(value)) {
    const all = value as Record<string, unknown>;
    const inner = all.fuselens && typeof all.fuselens === "object" ? (all.fuselens as Record<string, unknown>) : {};
    const { ["fuselens.trusted"]: _dropped, ...rest } = all;
    return { ...rest, fuselens: { ...inner, trusted } };
  }
  if (section === "fuselens.trusted") {
    return trusted;
  }
  return value;
}
