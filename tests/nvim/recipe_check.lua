-- Headless Neovim 0.11 check of the README's fuselens recipe (loaded as the
-- user's init.lua before this file runs). Opens $FL_FILE; once the server's
-- spare worker (started when the trusted folder opened) is warm, saves with :w
-- and times the diagnostics: the session's first run, nothing cached. Then it
-- saves 20 times in quick succession, alternating two texts, and waits until
-- the server has no analysis running: the diagnostics then are final. Writes a
-- JSON summary to $FL_OUT; `cquit 1` on failure. Every wait is for an event;
-- none is a sleep.
local file, out = os.getenv("FL_FILE"), os.getenv("FL_OUT")

local function fail(msg)
  io.stderr:write("nvim recipe check failed: " .. msg .. "\n")
  vim.cmd("cquit 1")
end

local function lines_of(diags)
  local got = {}
  for _, d in ipairs(diags) do table.insert(got, { line = d.lnum, code = d.code, source = d.source }) end
  return got
end

vim.cmd("edit " .. vim.fn.fnameescape(file))
local buf = vim.api.nvim_get_current_buf()
-- Neovim attaches a buffer once the server has answered `initialize`.
if not vim.wait(30000, function() return #vim.lsp.get_clients({ bufnr = buf, name = "fuselens" }) > 0 end, 10) then
  fail("the recipe attached no fuselens client to the buffer")
end
local client = vim.lsp.get_clients({ bufnr = buf, name = "fuselens" })[1]

local function server_info()
  local resp = client:request_sync("workspace/executeCommand", { command = "fuselens.serverInfo", arguments = {} }, 10000, buf)
  return resp and resp.result or {}
end

local summary = { root_dir = client.root_dir }
local attached = vim.uv.hrtime()
if not vim.wait(120000, function() return server_info().worker_warm == true end, 20) then
  fail("the server started no warm worker for the trusted folder")
end
summary.attach_to_warm_s = (vim.uv.hrtime() - attached) / 1e9
local t0 = vim.uv.hrtime()
vim.cmd("write")
if not vim.wait(120000, function() return #vim.diagnostic.get(buf) > 0 end, 10) then
  fail("no diagnostics within 120 s of :w")
end
summary.save_to_diagnostics_s = (vim.uv.hrtime() - t0) / 1e9
summary.first = lines_of(vim.diagnostic.get(buf))

-- 20 rapid saves; the last text has a comment line on top, so its recompile
-- sits one line lower: a stale result would show the old line. Odd saves are
-- the first text again (a cache hit, published at once), even ones the
-- shifted text (a run, cancelled by the next save but the last).
-- As after a user's look at the first results: the next spare worker is warm.
if not vim.wait(120000, function() return server_info().worker_warm == true end, 50) then
  fail("the server started no spare worker after the first run")
end
local original = vim.api.nvim_buf_get_lines(buf, 0, -1, false)
local shifted = vim.list_extend({ "# shifted" }, vim.deepcopy(original))
for i = 1, 20 do
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, (i % 2 == 0) and shifted or original)
  vim.cmd("silent write")
end
local t1 = vim.uv.hrtime()
-- Only a run of the shifted text shows line 4, and such a run ends after the
-- server has taken every save. The server writes a run's diagnostics before
-- it counts the run as ended, and Neovim handles messages in order: once
-- serverInfo then says nothing runs, no later diagnostics can come.
local function shows_shifted()
  local d = vim.diagnostic.get(buf)
  return #d == 1 and d[1].lnum == 4
end
if not vim.wait(180000, shows_shifted, 10) then
  fail("180 s after 20 saves the diagnostics are " .. vim.inspect(lines_of(vim.diagnostic.get(buf))))
end
summary.last_save_to_diagnostics_s = (vim.uv.hrtime() - t1) / 1e9
if not vim.wait(60000, function() return server_info().running == 0 end, 20) then
  fail("the server was still running an analysis 60 s after the last save's diagnostics")
end
summary.after_saves = lines_of(vim.diagnostic.get(buf))

local f = io.open(out, "w")
f:write(vim.fn.json_encode(summary))
f:close()
client:stop()
vim.wait(3000, function() return client:is_stopped() end, 100)
vim.cmd("qall!")
