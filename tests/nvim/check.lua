-- Neovim (0.7+) headless client check for the fuselens language server.
-- Opens $FL_FILE, waits for fuselens diagnostics, applies the preferred
-- quick-fix for the first one, writes the buffer to $FL_FIXED and a JSON
-- summary to $FL_OUT. Exits with `cquit 1` on any failure.
local file, fixed, out = os.getenv("FL_FILE"), os.getenv("FL_FIXED"), os.getenv("FL_OUT")
local python = os.getenv("FL_PYTHON") or "python3"

local function fail(msg)
  io.stderr:write("nvim check failed: " .. msg .. "\n")
  vim.cmd("cquit 1")
end

vim.cmd("edit " .. vim.fn.fnameescape(file))
local bufnr = vim.api.nvim_get_current_buf()
local client_id = vim.lsp.start_client({
  name = "fuselens",
  cmd = { python, "-m", "fuselens", "server" },
  root_dir = vim.fn.fnamemodify(file, ":h"),
  init_options = { trusted = true, runOn = "open" },
})
if not client_id then fail("could not start the server") end
vim.lsp.buf_attach_client(bufnr, client_id)

local got = vim.wait(180000, function() return #vim.diagnostic.get(bufnr) > 0 end, 200)
if not got then fail("no diagnostics within 180 s") end

local diags = vim.diagnostic.get(bufnr)
local summary = { diagnostics = {} }
for _, d in ipairs(diags) do
  table.insert(summary.diagnostics, { line = d.lnum, code = d.code, source = d.source, message = d.message })
end

local first = diags[1]
local params = {
  textDocument = { uri = vim.uri_from_bufnr(bufnr) },
  range = { start = { line = first.lnum, character = first.col }, ["end"] = { line = first.end_lnum, character = first.end_col } },
  context = { diagnostics = vim.lsp.diagnostic.get_line_diagnostics(bufnr, first.lnum) },
}
local responses = vim.lsp.buf_request_sync(bufnr, "textDocument/codeAction", params, 30000)
if not responses then fail("no code action response") end
summary.actions = {}
local applied = nil
for _, response in pairs(responses) do
  for _, action in ipairs(response.result or {}) do
    table.insert(summary.actions, action.title)
    -- Unverified fixes are never preferred (only `fuselens report` verifies):
    -- take the mark_dynamic one.
    if (action.isPreferred or string.find(action.title or "", "mark_dynamic", 1, true)) and not applied then
      vim.lsp.util.apply_workspace_edit(action.edit, "utf-16")
      applied = action.title
    end
  end
end
if not applied then fail("no mark_dynamic quick-fix among " .. #summary.actions .. " actions") end
summary.applied = applied

vim.cmd("write! " .. vim.fn.fnameescape(fixed))
local f = io.open(out, "w")
f:write(vim.fn.json_encode(summary))
f:close()
vim.lsp.stop_client(client_id)
vim.wait(2000, function() return vim.lsp.get_client_by_id(client_id) == nil end, 100)
vim.cmd("qall!")
