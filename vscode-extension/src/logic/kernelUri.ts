// Virtual documents for generated kernel source: `fuselens-kernel:` URIs.
//
// The server's code lens passes `[documentUri, firstKernelName, allKernelNames]`
// to `fuselens.showKernelSource`; the server command `fuselens.kernelSource`
// takes `(documentUri, kernelName)` and answers `{name, language, kind,
// graph_id, source}` (or `{source: "", error}`). The URI keeps those two
// arguments in its query and the kernel name in its path (the editor tab).
// Pure: works on URI components, the caller builds the vscode.Uri.

export const KERNEL_SCHEME = "fuselens-kernel";

export interface KernelUriParts {
  path: string;
  query: string;
}

/** The document a lens was on and the kernels it offers, first one first. */
export interface KernelChoices {
  uri: string;
  names: string[];
}

/**
 * Reads `[uri, name, names]` (the server's lens) or `[{uri, name}]`.
 * Names are de-duplicated, the lens's own first.
 */
export function kernelChoices(args: readonly unknown[]): KernelChoices {
  let uri = "";
  const names: string[] = [];
  const add = (n: unknown) => {
    if (typeof n === "string" && n && !names.includes(n)) {
      names.push(n);
    }
  };
  for (const [i, a] of args.entries()) {
    if (typeof a === "string") {
      if (i === 0) {
        uri = a;
      } else {
        add(a);
      }
    } else if (Array.isArray(a)) {
      a.forEach(add);
    } else if (a && typeof a === "object") {
      const o = a as { uri?: unknown; name?: unknown; kernel?: unknown };
      if (typeof o.uri === "string") {
        uri = o.uri;
      }
      add(o.name ?? o.kernel);
    }
  }
  return { uri, names };
}

/** Path and query of the virtual document of kernel `name` of document `uri`. */
export function kernelUriParts(uri: string, name: string): KernelUriParts {
  return { path: `/${safeName(name)}`, query: encodeURIComponent(JSON.stringify([uri, name])) };
}

/** The `fuselens.kernelSource` arguments back from a `fuselens-kernel:` URI query. */
export function kernelArgsFromQuery(query: string): [string, string] {
  const decoded = JSON.parse(decodeURIComponent(query));
  if (!Array.isArray(decoded) || decoded.length !== 2 || !decoded.every((v) => typeof v === "string")) {
    throw new Error("fuselens-kernel URI query is not [documentUri, kernelName]");
  }
  return [decoded[0], decoded[1]];
}

/** The server's answer to `fuselens.kernelSource`: a string or `{source, language}`. */
export function kernelSourceText(result: unknown): { text: string; language?: string } {
  if (typeof result === "string" && result) {
    return { text: result };
  }
  if (result && typeof result === "object") {
    const r = result as { source?: unknown; language?: unknown; kind?: unknown; error?: unknown };
    if (typeof r.source === "string" && r.source) {
      const language = typeof r.language === "string" && r.language ? r.language : String(r.kind ?? "");
      return { text: r.source, language: vscodeLanguageId(language) };
    }
    if (typeof r.error === "string" && r.error) {
      throw new Error(r.error);
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

function safeName(name: string): string {
  const cleaned = name.replace(/[^A-Za-z0-9_.:-]+/g, "_").replace(/^\.+/, "");
  return cleaned || "kernel";
}
