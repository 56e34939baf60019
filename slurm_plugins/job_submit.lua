--[[
job_submit.lua of the Slurm-Triton bridge: Slurm's job_submit/lua plugin (Lua 5.1).

slurmctld calls slurm_job_submit for every new job and slurm_job_modify for every job
update, before its own checks. Install it as job_submit.lua in the directory of
slurm.conf and set JobSubmitPlugins=lua (see slurm_plugins/README.md). slurmctld reads
the file again when it changes: no restart is needed after an edit.

What it does:
  1. A partition whose workload is "inference" (the bridge's Triton servers) takes only
     jobs of BRIDGE_ACCOUNT: any other account is refused at submission with a message
     that names the partition and the account it is reserved for, and no job update may
     move another account's job into it. (Slurm's AllowAccounts on that partition says
     the same thing later and less clearly; keep both.)
  2. A job that may run on a partition whose workload is "elastic" is made requeueable
     (requeue=1, even after --no-requeue): the bridge lends elastic nodes to Triton by
     preemption, and a preempted elastic job must come back, not die.
  3. Each job is tagged with its workload in its administrator comment,
     "stb:workload=<w>", from the first partition it names (or the default partition),
     appended with a comma to what the comment already holds. The ledger
     (accounting/attribution.py) books the job's GPU-hours to that workload.
     At submission an administrator's own stb:workload= tag is kept; a partition change
     re-tags the job when the update comes from root (Slurm lets only administrators
     change an administrator comment, and this plugin runs with the updater's rights).
  4. Batch inference: a job on an elastic partition whose own comment holds the mark
     "stb:batch" (sbatch --comment=stb:batch) is tagged "stb:workload=batch-inference"
     instead of "elastic": the ledger books it as its own workload. The mark is the
     user's word and changes only the booking: the job is still an elastic job
     (requeueable, preemptible). On any other partition the mark is ignored (a training
     job is never booked as batch work by its own say). A partition the map below names
     "batch-inference" tags every job so, and is made requeueable like an elastic one.
--]]

--------------------------------------------------------------------------------------
-- Site settings: edit these.
--------------------------------------------------------------------------------------

-- The Slurm account the bridge daemon submits its Triton servers with: the only one
-- that may use the inference partition(s).
BRIDGE_ACCOUNT = "bridge"

-- Partition -> workload (training, elastic, inference or batch-inference). A partition
-- of workload "inference" is reserved for BRIDGE_ACCOUNT; one of workload "elastic" or
-- "batch-inference" holds only requeueable jobs. Partitions not listed are left alone
-- and get no tag.
WORKLOAD_OF_PARTITION = {
	train = "training",
	elastic = "elastic",
	infer = "inference",
}

--------------------------------------------------------------------------------------

local TAG = "stb:workload="
-- What a user writes in the job's comment to ask for the batch-inference workload.
local BATCH_MARK = "stb:batch"
local BATCH = "batch-inference"
-- The workloads whose jobs must be requeueable (the bridge preempts them).
local REQUEUEABLE = { elastic = true, [BATCH] = true }

-- Numeric job fields read NO_VAL16 when the request leaves them unset.
local function unset(value)
	return value == nil or value == slurm.NO_VAL16
end

-- "a, b,c" -> {"a", "b", "c"}; nil or "" -> {}
local function split_partitions(text)
	local out = {}
	if text == nil then
		return out
	end
	for name in string.gmatch(text, "[^,]+") do
		name = string.gsub(name, "^%s*(.-)%s*$", "%1")
		if name ~= "" then
			table.insert(out, name)
		end
	end
	return out
end

-- The name of the default partition in part_list (a table of partition records).
local function default_partition(part_list)
	if type(part_list) ~= "table" then
		return nil
	end
	for key, part in pairs(part_list) do
		local flag = part.flag_default
		if flag == 1 or flag == true then
			return part.name or key
		end
	end
	return nil
end

local function reserved_partition(parts)
	for _, name in ipairs(parts) do
		if WORKLOAD_OF_PARTITION[name] == "inference" then
			return name
		end
	end
	return nil
end

local function any_elastic(parts)
	for _, name in ipairs(parts) do
		if REQUEUEABLE[WORKLOAD_OF_PARTITION[name]] then
			return true
		end
	end
	return false
end

-- Whether a job's own comment holds BATCH_MARK as a whole item (comma, semicolon or
-- space separated, as the ledger reads tags): "stb:batchy" is not the mark.
local function asks_batch(comment)
	if comment == nil then
		return false
	end
	for item in string.gmatch(comment, "[^,;%s]+") do
		if item == BATCH_MARK then
			return true
		end
	end
	return false
end

-- The workload a job's first partition and its own comment give it (nil: no tag).
local function workload_of(parts, comment)
	local workload = parts[1] and WORKLOAD_OF_PARTITION[parts[1]]
	if workload == "elastic" and asks_batch(comment) then
		return BATCH
	end
	return workload
end

-- The comment with "stb:workload=<w>": appended (comma) when it has none; with
-- replace, an existing tag is rewritten; without, it is kept.
local function with_tag(comment, workload, replace)
	if comment == nil or comment == "" then
		return TAG .. workload
	end
	if string.find(comment, TAG, 1, true) then
		if not replace then
			return comment
		end
		local rewritten = string.gsub(comment, "stb:workload=[%w_.:-]*", TAG .. workload)
		return rewritten
	end
	return comment .. "," .. TAG .. workload
end

local function refusal(partition, account)
	return string.format(
		"partition %s is reserved for the %s account (the Slurm-Triton bridge's "
			.. "inference servers); account %s may not use it: submit to another "
			.. "partition (e.g. train or elastic)",
		partition,
		BRIDGE_ACCOUNT,
		account
	)
end

function slurm_job_submit(job_desc, part_list, submit_uid)
	local parts = split_partitions(job_desc.partition)
	if #parts == 0 then
		local default = default_partition(part_list)
		if default ~= nil then
			parts = { default }
		end
	end
	local account = job_desc.account or job_desc.default_account or "(none)"

	local reserved = reserved_partition(parts)
	if reserved ~= nil and account ~= BRIDGE_ACCOUNT then
		local msg = refusal(reserved, account)
		slurm.log_info("stb job_submit: uid %s refused: %s", tostring(submit_uid), msg)
		slurm.log_user("%s", msg)
		return slurm.ESLURM_INVALID_ACCOUNT
	end

	if any_elastic(parts) then
		job_desc.requeue = 1
	end

	local workload = workload_of(parts, job_desc.comment)
	if workload ~= nil then
		job_desc.admin_comment = with_tag(job_desc.admin_comment, workload, false)
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	local moving = job_desc.partition ~= nil
	local no_requeue = not unset(job_desc.requeue) and job_desc.requeue ~= 1
	if not moving and job_desc.account == nil and not no_requeue then
		return slurm.SUCCESS
	end
	local parts = split_partitions(job_desc.partition or job_rec.partition)
	local account = job_desc.account or job_rec.account or "(none)"

	local reserved = reserved_partition(parts)
	if (moving or job_desc.account ~= nil) and reserved ~= nil and account ~= BRIDGE_ACCOUNT then
		-- slurm.log_user does not reach the user from job_modify in Slurm 22.05
		-- (SchedMD bug 14539): the refusal is logged by slurmctld.
		slurm.log_info(
			"stb job_modify: job %s by uid %s refused: %s",
			tostring(job_rec.job_id),
			tostring(modify_uid),
			refusal(reserved, account)
		)
		return slurm.ESLURM_INVALID_ACCOUNT
	end

	-- Only a move or an explicit "Requeue=0" sets it: a running job's other updates
	-- (time limit, comment) pass untouched.
	if any_elastic(parts) and (moving or no_requeue) then
		job_desc.requeue = 1
	end

	if moving then
		local workload = workload_of(parts, job_desc.comment or job_rec.comment)
		if workload ~= nil and modify_uid == 0 then
			local current = job_desc.admin_comment or job_rec.admin_comment
			job_desc.admin_comment = with_tag(current, workload, true)
		elseif workload ~= nil then
			slurm.log_info(
				"stb job_modify: job %s moved to %s by uid %s; its workload tag is "
					.. "left as it was (only an administrator may change it)",
				tostring(job_rec.job_id),
				job_desc.partition,
				tostring(modify_uid)
			)
		end
	end
	return slurm.SUCCESS
end

slurm.log_info("stb job_submit.lua loaded (bridge account %s)", BRIDGE_ACCOUNT)
return slurm.SUCCESS
