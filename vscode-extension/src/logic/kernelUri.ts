// Virtual documents for generated kernel source: `fuselens-kernel:` URIs.
//
// The URI carries the arguments of the server's `fuselens.kernelSource`
// command (whatever the code lens passed) in its query, and a path whose file
// extension gives the document its language (C++ or Python for Triton).
// Pure: works on URI components, the caller builds the vscode.Uri.

export const KERNEL_SCHEME = "fuselens-kernel";

export interface KernelUriParts {
  path: string;
  query: string;
}

/** The fields a kernel reference may carry (server-defined; all optional). */
interface KernelRef {
  name?: unknown;
  kernel?: unknown;
  language?: unknown;
  kind?: unknown;
  graph_id?: unknown;
  graphId?: unknown;
}

/** Builds path and query for the arguments a code lens gave `fuselens.showKernelSource`. */
export function kernelUriParts(args: unknown[]): KernelUriParts {
  const ref = firstObject(args);
  const name = safeName(String(ref?.name ?? ref?.kernel ?? (typeof args[0] === "string" ? args[0] : "kernel")));
  const graph = ref?.graph_id ?? ref?.graphId;
  const dir = typeof graph === "string" && graph ? `/${safeName(graph)}` : "";
  const ext = languageExtension(String(ref?.language ?? ref?.kind ?? ""));
  return { path: `${dir}/${name}${ext}`, query: encodeURIComponent(JSON.stringify(args)) };
}

/** The command arguments back from a `fuselens-kernel:` URI query. */
export function kernelArgsFromQuery(query: string): unknown[] {
  const decoded = JSON.parse(decodeURIComponent(query));
  if (!Array.isArray(decoded)) {
    throw new Error("fuselens-kernel URI query is not an argument list");
  }
  return decoded;
}

/** The server's answer to `fuselens.kernelSource`: a string or `{source, language}`. */
export function kernelSourceText(result: unknown): { text: string; language?: string } {
  if (typeof result === "string") {
    return { text: result };
  }
  if (result && typeof result === "object") {
    const r = result as { source?: unknown; text?: unknown; language?: unknown };
    const text = typeof r.source === "string" ? r.source : typeof r.text === "string" ? r.text : undefined;
    if (text !== undefined) {
      return { text, language: typeof r.language === "string" ? vscodeLanguageId(r.language) : undefined };
    }
  }
  throw new Error("the server returned no kernel source");
}

/** Maps a fuselens kernel language ("cpp", "python", "triton") to a VS Code language id. */
export function vscodeLanguageId(language: string): string | undefined {
  switch (language.toLowerCase()) {
    case "cpp":
    case "c++":
      return "cpp";
    case "python":
    case "triton":
      return "python";
    default:
      return undefined;
  }
}

function languageExtension(language: string): string {
  const id = vscodeLanguageId(language);
  return id === "cpp" ? ".cpp" : id === "python" ? ".py" : "";
}

function firstObject(args: unknown[]): KernelRef | undefined {
  const found = args.find((a) => a !== null && typeof a === "object" && !Array.isArray(a));
  return found as KernelRef | undefined;
}

function safeName(name: string): string {
  const cleaned = name.replace(/[^A-Za-z0-9_.:-]+/g, "_").replace(/^\.+/, "");
  return cleaned || "kernel";
}
