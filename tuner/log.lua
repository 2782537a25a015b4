-- The tuning log: append-only plain text, one line per measurement, flushed
-- as it is written, so an interrupted run resumes where it stopped. Fields
-- (tab-separated):
--   build shape bucket len cache stage config key status median_us times_us name
-- build names the library build and the CPU model (M.build_id: a measurement
-- of another build or CPU model is never reused); stage is quick, c (the
-- coarse pass's best chunk row re-timed once), k<round> (the quick pass's
-- fastest kernels re-timed, interleaved), r<round> (refinement,
-- interleaved; ref in older logs) or v<round> and
-- w<round> (verification of the winner and of the runner-up); status
-- is "ok" or "failed: <why>"; times_us is a comma list. Lines starting with
-- '#' are comments. A verification's decision (tuner/stats.lua) is a line
-- "#decision" TAB then DECISION_FIELDS: the challenger and heuristic configs,
-- rounds run and their cap, the 95% interval of the median ratio
-- challenger/heuristic (ratio_ci "lo..hi"), its median and exact coverage,
-- the verdict, why the rounds stopped, the level switch seen ("-" or
-- "<slow/fast>x fast <n> <lo..hi> slow <n> <lo..hi>") and which config was
-- kept. Decisions derive from the v<round> lines, so resuming recomputes
-- them (and writes a decision line only once).
-- Notes of the search, one line each, written once and parsed back on
-- resume (a malformed one is skipped with a warning, as a measurement is):
-- "#pruned" TAB then NOTES.pruned (what was left out of the search and why:
-- a kernel, a chunk, an isa) and "#coverage" TAB then NOTES.coverage (what
-- the search measured of the space: kernels measured of the space's,
-- kernels pruned, decompositions measured, configurations measured).
local stats = require("tuner.stats")

local M = {}
M.FIELDS = { "build", "shape", "bucket", "len", "cache", "stage", "config", "key", "status", "median_us", "times_us", "name" }
M.DECISION_FIELDS = { "build", "shape", "bucket", "len", "cache", "challenger", "heuristic", "rounds", "cap", "ratio_ci",
                      "median", "coverage", "decision", "stop", "levels", "kept", "name" }
M.NOTES = {
  pruned = { "build", "shape", "bucket", "len", "cache", "what", "why", "name" },
  coverage = { "build", "shape", "bucket", "len", "cache", "kernels", "space", "pruned", "decompositions", "configs", "name" },
}
M.COMMENT = "# flashdecode tuning log: " .. table.concat(M.FIELDS, " ") .. "\n"
  .. "# #decision " .. table.concat(M.DECISION_FIELDS, " ") .. "\n"
  .. "# #pruned " .. table.concat(M.NOTES.pruned, " ") .. "\n"
  .. "# #coverage " .. table.concat(M.NOTES.coverage, " ") .. "\n"

-- The build id of log lines (tuner/tune.lua, tuner/sweep.lua): library
-- version, template hash, tcc version, then the CPU (tuner/machine.lua
-- cpu_id), so that neither another build's measurement nor another CPU
-- model's under the same slug is reused. Without cpu: the library build's
-- prefix that M.of_build matches (what a tuned table records of its build).
function M.build_id(version, templates, tcc, cpu)
  local id = ("%s-%s-tcc%s"):format(version, templates, tcc)
  return cpu and (id .. "-" .. cpu) or id
end

-- Whether log build id b is of library build prefix (M.build_id without cpu),
-- on any CPU; logs written before the CPU joined the id end at the prefix.
function M.of_build(b, prefix)
  return b == prefix or b:sub(1, #prefix + 1) == prefix .. "-"
end

-- A text field with tabs and newlines replaced.
local function clean(s) return (tostring(s):gsub("[\t\r\n]", " ")) end

-- The identity of a measurement (what resuming matches on).
local function id_of(r)
  return table.concat({ r.build, r.shape, r.bucket, r.len, r.cache, r.stage, r.config }, "\t")
end

-- One record as a log line.
function M.format(r)
  local times = {}
  for i, t in ipairs(r.times or {}) do times[i] = ("%.1f"):format(t) end
  return table.concat({ clean(r.build), clean(r.shape), ("%d"):format(r.bucket), ("%d"):format(r.len), r.cache, r.stage,
    r.config, r.key or "-", r.ok and "ok" or ("failed: " .. clean(r.err or "?")),
    r.ok and ("%.1f"):format(r.median_us) or "-", #times > 0 and table.concat(times, ",") or "-", clean(r.name) }, "\t")
end

-- A log line as a record, or nil and why.
function M.parse(line)
  local f = {}
  for x in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
  if #f ~= #M.FIELDS then return nil, ("has %d fields, want %d"):format(#f, #M.FIELDS) end
  local r = {}
  for i, name in ipairs(M.FIELDS) do r[name] = f[i] end
  r.bucket, r.len = tonumber(r.bucket), tonumber(r.len)
  r.ok = r.status == "ok"
  r.err = not r.ok and r.status:gsub("^failed: ", "") or nil
  r.median_us = tonumber(r.median_us)
  r.times = {}
  for t in r.times_us:gmatch("[^,]+") do r.times[#r.times + 1] = tonumber(t) end
  if not r.bucket or not r.len or (r.ok and (not r.median_us or #r.times == 0)) then return nil, "has a malformed number" end
  return r
end

-- Open the log at path for build: read the measurements already there (a
-- malformed line, e.g. one cut by an interruption, is skipped with a
-- warning naming it), then append.
function M.open(path, build)
  local L = { path = path, build = build, index = {}, reused = 0, written = 0, old = 0, decisions = {},
              notes = {} }
  local fh = io.open(path, "rb")
  if fh then
    local n = 0
    for line in fh:lines() do
      n = n + 1
      if line:sub(1, 10) == "#decision\t" then L.decisions[line] = true
      elseif M.note_kind(line) then
        local r, why = M.parse_note(line)
        if not r then io.stderr:write(("tune: %s:%d: skipped: %s\n"):format(path, n, why))
        else L.notes[line] = r end
      elseif line ~= "" and line:sub(1, 1) ~= "#" then
        local r, why = M.parse(line)
        if not r then io.stderr:write(("tune: %s:%d: skipped: %s\n"):format(path, n, why))
        elseif r.build == build then L.index[id_of(r)] = r; L.old = L.old + 1 end
      end
    end
    fh:close()
  end
  local new = not fh
  L.fh = assert(io.open(path, "ab"))
  if new then L.fh:write(M.COMMENT) end
  setmetatable(L, { __index = M })
  return L
end

-- The logged record for measurement r (fields of id_of), or nil.
function M:get(r)
  r.build = self.build
  local hit = self.index[id_of(r)]
  if hit then self.reused = self.reused + 1 end
  return hit
end

-- Append record r (flushed now) and index it.
function M:put(r)
  r.build = self.build
  self.fh:write(M.format(r), "\n")
  self.fh:flush()
  self.index[id_of(r)] = r
  self.written = self.written + 1
end

-- The level-switch field of decision d.
local function levels_text(d)
  if not d.switch then return "-" end
  local l = d.switch.levels
  return ("%.3fx fast %d %s slow %d %s"):format(d.switch.ratio, l[1].n, stats.ci_text(l[1]), l[2].n, stats.ci_text(l[2]))
end

-- A decision record ({ shape, bucket, len, cache, challenger, heuristic, d (stats), kept, name }) as a log line.
function M.format_decision(r)
  local d = r.d
  return "#decision\t" .. table.concat({ clean(r.build), clean(r.shape), ("%d"):format(r.bucket), ("%d"):format(r.len),
    r.cache, r.challenger, r.heuristic, ("%d"):format(d.rounds or d.n), ("%d"):format(d.cap or d.rounds or d.n),
    stats.ci_text(d), ("%.4f"):format(d.med), ("%.4f"):format(d.coverage), d.decision, d.stop or "-", levels_text(d),
    r.kept, clean(r.name) }, "\t")
end

-- Append decision record r (see format_decision) unless the same line is on record.
function M:decision(r)
  r.build = self.build
  local line = M.format_decision(r)
  if self.decisions[line] then return end
  self.decisions[line] = true
  self.fh:write(line, "\n")
  self.fh:flush()
end

-- The kind of a note line ("pruned", "coverage"), or nil.
function M.note_kind(line)
  local kind = line:match("^#(%a+)\t")
  return kind and M.NOTES[kind] and kind or nil
end

-- A note record r of kind (fields of NOTES[kind]) as a log line.
function M.format_note(kind, r)
  local f = {}
  for i, name in ipairs(M.NOTES[kind]) do
    if r[name] == nil then error(("log: %s note: field %s is missing"):format(kind, name), 0) end
    f[i] = clean(r[name])
  end
  return "#" .. kind .. "\t" .. table.concat(f, "\t")
end

-- A note line as a record (with kind; bucket, len and the counts as numbers), or nil and why.
function M.parse_note(line)
  local kind = M.note_kind(line)
  if not kind then return nil, "is not a note line" end
  local f = {}
  for x in (line .. "\t"):gmatch("([^\t]*)\t") do f[#f + 1] = x end
  local names = M.NOTES[kind]
  if #f - 1 ~= #names then return nil, ("#%s has %d fields, want %d"):format(kind, #f - 1, #names) end
  local r = { kind = kind }
  for i, name in ipairs(names) do r[name] = f[i + 1] end
  for _, name in ipairs { "bucket", "len", "kernels", "space", "pruned", "decompositions", "configs" } do
    if r[name] ~= nil then
      r[name] = tonumber(r[name])
      if not r[name] then return nil, ("#%s: field %s is not a number"):format(kind, name) end
    end
  end
  return r
end

-- Append note r of kind (see format_note) unless the same line is on record.
function M:note(kind, r)
  r.build = self.build
  local line = M.format_note(kind, r)
  if self.notes[line] then return end
  self.notes[line] = r
  self.fh:write(line, "\n")
  self.fh:flush()
end

-- Close the log.
function M:close() if self.fh then self.fh:close(); self.fh = nil end end

return M
