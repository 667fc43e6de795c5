package report

// lineDecoder turns one trimmed line into one event, with serde's rules for
// the internally tagged TraceEvent enum: the "kind" tag is required and may
// appear once; known fields may appear once; unknown fields are ignored.
// It reuses its buffers from line to line.
type lineDecoder struct {
	sc      jsonScanner
	members []jsonMember

	spanStart spanStartEvent
	spanEnd   spanEndEvent
	op        opEvent
	tensor    tensorEvent
	stats     tensorStatsEvent
	memory    memoryEvent
	devMem    deviceMemoryEvent
	interval  deviceIntervalEvent
	gradient  gradientEvent
	edge      edgeEvent
	terminal  terminalEvent
	meta      *Meta
}

// decode scans line and decodes the event it holds. A syntax error is
// returned as is (errJSONEnd or *jsonSyntaxError) so the caller can tell a
// cut line from a broken one.
func (d *lineDecoder) decode(line []byte) (eventKind, error) {
	d.sc.arena = d.sc.arena[:0]
	var err error
	d.members, err = d.sc.scanObject(line, d.members[:0])
	if err != nil {
		return 0, err
	}
	kind, err := d.tag(d.members, "kind", "trace event", kindNames)
	if err != nil {
		return 0, err
	}
	k := eventKind(kind)
	switch k {
	case kindMeta:
		d.meta, err = decodeMeta(&d.sc, d.members)
	case kindSpanStart:
		err = d.decodeSpanStart()
	case kindSpanEnd:
		err = d.decodeSpanEnd()
	case kindOp:
		err = d.decodeOp()
	case kindTensor:
		err = d.decodeTensor()
	case kindTensorStats:
		err = d.decodeTensorStats()
	case kindMemory:
		err = d.decodeMemory()
	case kindDeviceMemory:
		err = d.decodeDeviceMemory()
	case kindDeviceInterval:
		err = d.decodeDeviceInterval()
	case kindGradient:
		err = d.decodeGradient()
	case kindEdge:
		err = d.decodeEdge()
	case kindTerminal:
		err = d.decodeTerminal()
	}
	return k, err
}

// tag finds the internal tag of an object. Its value must be a string naming
// a variant.
func (d *lineDecoder) tag(ms []jsonMember, tag, obj string, names []string) (int, error) {
	found := -1
	for i := range ms {
		if string(ms[i].key) != tag {
			continue
		}
		if found >= 0 {
			return 0, errf(CodeDuplicateKey, "%s: duplicate field `%s`", obj, tag)
		}
		found = i
	}
	if found < 0 {
		if tag == "kind" {
			return 0, errf(CodeMissingKind, "%s: missing field `kind`", obj)
		}
		return 0, errf(CodeMissingField, "%s: missing field `%s`", obj, tag)
	}
	v := ms[found].val
	if v.kind != jString {
		return 0, typeErr(obj, tag, v, "a string")
	}
	for i, n := range names {
		if string(v.raw) == n {
			return i, nil
		}
	}
	if tag == "kind" {
		return 0, errf(CodeUnknownKind, "unknown event kind %q", v.raw)
	}
	return 0, errf(CodeUnknownVariant, "%s: unknown variant %q for `%s`", obj, v.raw, tag)
}

func (d *lineDecoder) decodeSpanStart() error {
	e := &d.spanStart
	*e = spanStartEvent{step: stepNone}
	f := fields{obj: "span_start"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "id":
			if err = f.first(0, k); err == nil {
				e.id, err = getStr(f.obj, k, m.val)
			}
		case "name":
			if err = f.first(1, k); err == nil {
				e.name, err = getStr(f.obj, k, m.val)
			}
		case "start_ns":
			if err = f.first(2, k); err == nil {
				e.start, err = getU64(f.obj, k, m.val)
			}
		case "span_kind":
			if err = f.first(3, k); err == nil {
				e.spanKind, err = d.sc.getEnum(f.obj, k, m.val, spanKindNames)
			}
		case "parent_id":
			if err = f.first(4, k); err == nil {
				e.parent, e.hasParent, err = getOptStr(f.obj, k, m.val)
			}
		case "measured":
			if err = f.first(5, k); err == nil {
				e.measured, err = getBool(f.obj, k, m.val)
			}
		case "step":
			if err = f.first(6, k); err == nil && m.val.kind != jNull {
				e.step, err = d.sc.getEnum(f.obj, k, m.val, stepNames)
			}
		case "tid":
			// Ours and unknown to candle-graph: never an error.
			if n, ok := parseU64(m.val.raw); m.val.kind == jNumber && ok {
				e.tid, e.hasTID = n, true
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("id", "name", "start_ns", "span_kind")
}

func (d *lineDecoder) decodeSpanEnd() error {
	e := &d.spanEnd
	*e = spanEndEvent{}
	f := fields{obj: "span_end"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "id":
			if err = f.first(0, k); err == nil {
				e.id, err = getStr(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(1, k); err == nil {
				e.duration, err = getU64(f.obj, k, m.val)
			}
		case "tracer_ns": // ours: candle-graph ignores it, and so does a reader when it is no u64
			e.tracer, e.hasTracer = parseU64(m.val.raw)
			e.hasTracer = e.hasTracer && m.val.kind == jNumber
		}
		if err != nil {
			return err
		}
	}
	return f.require("id")
}

func (d *lineDecoder) decodeOp() error {
	e := &d.op
	*e = opEvent{inputs: e.inputs[:0], shape: e.shape[:0]}
	f := fields{obj: "op"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.spanID, err = getStr(f.obj, k, m.val)
			}
		case "op_name":
			if err = f.first(1, k); err == nil {
				e.opName, err = getStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(2, k); err == nil {
				e.shape, err = d.sc.getU64List(f.obj, k, m.val, e.shape)
			}
		case "dtype":
			if err = f.first(3, k); err == nil {
				e.dtype, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(4, k); err == nil {
				e.device, err = getStr(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(5, k); err == nil {
				e.duration, err = getU64(f.obj, k, m.val)
			}
		case "input_dense_bytes":
			if err = f.first(6, k); err == nil {
				e.inBytes, err = getU64(f.obj, k, m.val)
			}
		case "inputs":
			if err = f.first(7, k); err == nil {
				e.inputs, err = d.sc.getStrList(f.obj, k, m.val, e.inputs)
			}
		case "output":
			if err = f.first(8, k); err == nil {
				e.output, e.hasOutput, err = getOptStr(f.obj, k, m.val)
			}
		case "timestamp_ns":
			if err = f.first(9, k); err == nil {
				e.timestamp, err = getU64(f.obj, k, m.val)
			}
		case "output_dense_bytes":
			if err = f.first(10, k); err == nil {
				e.outBytes, e.hasOutBytes, err = getOptU64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "op_name", "shape", "dtype", "device", "duration_ns", "input_dense_bytes")
}

func (d *lineDecoder) decodeTensor() error {
	e := &d.tensor
	*e = tensorEvent{shape: e.shape[:0], category: categoryOther}
	f := fields{obj: "tensor"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.spanID, err = getStr(f.obj, k, m.val)
			}
		case "tensor_id":
			if err = f.first(1, k); err == nil {
				e.tensorID, err = getStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(2, k); err == nil {
				e.shape, err = d.sc.getU64List(f.obj, k, m.val, e.shape)
			}
		case "dtype":
			if err = f.first(3, k); err == nil {
				e.dtype, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(4, k); err == nil {
				e.device, err = getStr(f.obj, k, m.val)
			}
		case "label":
			if err = f.first(5, k); err == nil {
				e.label, e.hasLabel, err = getOptStr(f.obj, k, m.val)
			}
		case "requires_grad":
			if err = f.first(6, k); err == nil {
				e.requiresGrad, err = getBool(f.obj, k, m.val)
			}
		case "dense_bytes":
			if err = f.first(7, k); err == nil {
				e.denseBytes, e.hasDenseBytes, err = getOptU64(f.obj, k, m.val)
			}
		case "category":
			if err = f.first(8, k); err == nil {
				e.category, err = d.sc.getEnum(f.obj, k, m.val, categoryNames)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "tensor_id", "shape", "dtype", "device")
}

func (d *lineDecoder) decodeTensorStats() error {
	e := &d.stats
	*e = tensorStatsEvent{shape: e.shape[:0]}
	f := fields{obj: "tensor_stats"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.spanID, err = getStr(f.obj, k, m.val)
			}
		case "label":
			if err = f.first(1, k); err == nil {
				e.label, err = getStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(2, k); err == nil {
				e.shape, err = d.sc.getU64List(f.obj, k, m.val, e.shape)
			}
		case "dtype":
			if err = f.first(3, k); err == nil {
				e.dtype, err = getStr(f.obj, k, m.val)
			}
		case "elements":
			if err = f.first(4, k); err == nil {
				e.elements, err = getU64(f.obj, k, m.val)
			}
		case "non_finite":
			if err = f.first(5, k); err == nil {
				e.nonFinite, err = getU64(f.obj, k, m.val)
			}
		case "rms":
			if err = f.first(6, k); err == nil {
				e.rms, err = getF64(f.obj, k, m.val)
			}
		case "abs_max":
			if err = f.first(7, k); err == nil {
				e.absMax, err = getF64(f.obj, k, m.val)
			}
		case "mean":
			if err = f.first(8, k); err == nil {
				e.mean, err = getF64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "label", "shape", "dtype", "elements", "non_finite", "rms", "abs_max", "mean")
}

func (d *lineDecoder) decodeMemory() error {
	e := &d.memory
	*e = memoryEvent{shape: e.shape[:0], category: categoryOther}
	f := fields{obj: "memory"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "timestamp_ns":
			if err = f.first(0, k); err == nil {
				e.timestamp, err = getU64(f.obj, k, m.val)
			}
		case "storage_id":
			if err = f.first(1, k); err == nil {
				e.storageID, err = getStr(f.obj, k, m.val)
			}
		case "tensor_id":
			if err = f.first(2, k); err == nil {
				e.tensorID, err = getStr(f.obj, k, m.val)
			}
		case "span_id":
			if err = f.first(3, k); err == nil {
				e.spanID, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(4, k); err == nil {
				e.device, err = getStr(f.obj, k, m.val)
			}
		case "bytes":
			if err = f.first(5, k); err == nil {
				e.bytes, err = getU64(f.obj, k, m.val)
			}
		case "action":
			if err = f.first(6, k); err == nil {
				e.action, err = d.sc.getEnum(f.obj, k, m.val, actionNames)
			}
		case "dtype":
			if err = f.first(7, k); err == nil {
				e.dtype, err = getStr(f.obj, k, m.val)
			}
		case "op_name":
			if err = f.first(8, k); err == nil {
				e.opName, e.hasOpName, err = getOptStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(9, k); err == nil {
				e.shape, err = d.sc.getU64List(f.obj, k, m.val, e.shape)
			}
		case "category":
			if err = f.first(10, k); err == nil {
				e.category, err = d.sc.getEnum(f.obj, k, m.val, categoryNames)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("timestamp_ns", "storage_id", "tensor_id", "span_id", "device", "bytes", "action", "dtype")
}

func (d *lineDecoder) decodeDeviceMemory() error {
	e := &d.devMem
	*e = deviceMemoryEvent{}
	f := fields{obj: "device_memory"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "timestamp_ns":
			if err = f.first(0, k); err == nil {
				e.timestamp, err = getU64(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(1, k); err == nil {
				e.device, err = getStr(f.obj, k, m.val)
			}
		case "used_bytes":
			if err = f.first(2, k); err == nil {
				e.used, e.hasUsed, err = getOptU64(f.obj, k, m.val)
			}
		case "free_bytes":
			if err = f.first(3, k); err == nil {
				e.free, e.hasFree, err = getOptU64(f.obj, k, m.val)
			}
		case "reserved_bytes":
			if err = f.first(4, k); err == nil {
				e.reserved, e.hasReserved, err = getOptU64(f.obj, k, m.val)
			}
		case "capacity_bytes":
			if err = f.first(5, k); err == nil {
				e.capacity, e.hasCapacity, err = getOptU64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("timestamp_ns", "device")
}

func (d *lineDecoder) decodeDeviceInterval() error {
	e := &d.interval
	*e = deviceIntervalEvent{}
	f := fields{obj: "device_interval"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.spanID, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(1, k); err == nil {
				e.device, err = getStr(f.obj, k, m.val)
			}
		case "stream_id":
			if err = f.first(2, k); err == nil {
				e.streamID, err = getStr(f.obj, k, m.val)
			}
		case "clock_id":
			if err = f.first(3, k); err == nil {
				e.clockID, err = getStr(f.obj, k, m.val)
			}
		case "backend":
			if err = f.first(4, k); err == nil {
				e.backend, err = getStr(f.obj, k, m.val)
			}
		case "start_ns":
			if err = f.first(5, k); err == nil {
				e.start, err = getU64(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(6, k); err == nil {
				e.duration, err = getU64(f.obj, k, m.val)
			}
		case "name":
			// Ours and unknown to candle-graph: never an error.
			if m.val.kind == jString {
				e.name = m.val.raw
			}
		case "correlation_id":
			// Ours too: kept when it is an unsigned integer, else ignored.
			if v, cerr := getU64(f.obj, k, m.val); cerr == nil {
				e.correlation, e.hasCorrelation = v, true
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "device", "stream_id", "clock_id", "backend", "start_ns", "duration_ns")
}

func (d *lineDecoder) decodeGradient() error {
	e := &d.gradient
	*e = gradientEvent{}
	f := fields{obj: "gradient"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "event_id":
			if err = f.first(0, k); err == nil {
				e.eventID, err = getStr(f.obj, k, m.val)
			}
		case "root":
			if err = f.first(1, k); err == nil {
				e.root, err = getStr(f.obj, k, m.val)
			}
		case "key":
			if err = f.first(2, k); err == nil {
				e.key, err = getStr(f.obj, k, m.val)
			}
		case "state":
			if err = f.first(3, k); err == nil {
				e.state, err = d.sc.getEnum(f.obj, k, m.val, gradStateNames)
			}
		case "norm":
			if err = f.first(4, k); err == nil {
				e.norm, e.hasNorm, err = getOptF64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("event_id", "root", "key", "state")
}

func (d *lineDecoder) decodeEdge() error {
	e := &d.edge
	*e = edgeEvent{}
	ek, err := d.tag(d.members, "edge_kind", "edge", edgeKindNames)
	if err != nil {
		return err
	}
	e.call = ek == 0
	f := fields{obj: "edge"}
	for _, m := range d.members {
		k := string(m.key)
		if e.call {
			switch k {
			case "from_span":
				if err = f.first(0, k); err == nil {
					e.from, err = getStr(f.obj, k, m.val)
				}
			case "to_span":
				if err = f.first(1, k); err == nil {
					e.to, err = getStr(f.obj, k, m.val)
				}
			case "host_duration_ns":
				if err = f.first(2, k); err == nil {
					e.hostDuration, err = getU64(f.obj, k, m.val)
				}
			}
		} else {
			switch k {
			case "from_tensor":
				if err = f.first(0, k); err == nil {
					e.from, err = getStr(f.obj, k, m.val)
				}
			case "to_tensor":
				if err = f.first(1, k); err == nil {
					e.to, err = getStr(f.obj, k, m.val)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if e.call {
		return f.require("from_span", "to_span", "host_duration_ns")
	}
	return f.require("from_tensor", "to_tensor")
}

func (d *lineDecoder) decodeTerminal() error {
	e := &d.terminal
	*e = terminalEvent{}
	f := fields{obj: "terminal"}
	var err error
	for _, m := range d.members {
		switch k := string(m.key); k {
		case "outcome":
			if err = f.first(0, k); err == nil {
				e.outcome, err = d.sc.getEnum(f.obj, k, m.val, outcomeNames)
			}
		case "timestamp_ns":
			if err = f.first(1, k); err == nil {
				e.timestamp, err = getU64(f.obj, k, m.val)
			}
		case "reason":
			if err = f.first(2, k); err == nil {
				e.reason, e.hasReason, err = getOptStr(f.obj, k, m.val)
			}
		case "tracer_ns": // ours, as on span_end
			e.tracer, e.hasTracer = parseU64(m.val.raw)
			e.hasTracer = e.hasTracer && m.val.kind == jNumber
		case "tracer_estimated_ns":
			if m.val.kind == jNumber {
				e.estimated, _ = parseU64(m.val.raw)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("outcome", "timestamp_ns")
}
