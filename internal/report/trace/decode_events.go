package trace

import "github.com/candle-trace/candle-trace/internal/traceformat"

// lineDecoder turns one trimmed line into one event, with serde's rules for
// the internally tagged TraceEvent enum: the "kind" tag is required and may
// appear once; known fields may appear once; unknown fields are ignored.
// It reuses its buffers from line to line.
type Decoder struct {
	sc      jsonScanner
	members []jsonMember

	SpanStart      SpanStartEvent
	SpanEnd        SpanEndEvent
	Op             OpEvent
	Tensor         TensorEvent
	TensorStats    TensorStatsEvent
	Memory         MemoryEvent
	DeviceMemory   DeviceMemoryEvent
	DeviceInterval DeviceIntervalEvent
	Gradient       GradientEvent
	Edge           EdgeEvent
	Terminal       terminalEvent
	Meta           *Meta
}

// decode scans line and decodes the event it holds. A syntax error is
// returned as is (errJSONEnd or *jsonSyntaxError) so the caller can tell a
// cut line from a broken one.
func (d *Decoder) Decode(line []byte) (Kind, error) {
	d.sc.arena = d.sc.arena[:0]
	var err error
	d.members, err = d.sc.scanObject(line, d.members[:0])
	if err != nil {
		return 0, err
	}
	kind, err := d.tag(d.members, "kind", "trace event", traceformat.Kinds)
	if err != nil {
		return 0, err
	}
	k := Kind(kind)
	switch k {
	case KindMeta:
		d.Meta, err = decodeMeta(&d.sc, d.members)
	case KindSpanStart:
		err = d.decodeSpanStart()
	case KindSpanEnd:
		err = d.decodeSpanEnd()
	case KindOp:
		err = d.decodeOp()
	case KindTensor:
		err = d.decodeTensor()
	case KindTensorStats:
		err = d.decodeTensorStats()
	case KindMemory:
		err = d.decodeMemory()
	case KindDeviceMemory:
		err = d.decodeDeviceMemory()
	case KindDeviceInterval:
		err = d.decodeDeviceInterval()
	case KindGradient:
		err = d.decodeGradient()
	case KindEdge:
		err = d.decodeEdge()
	case KindTerminal:
		err = d.decodeTerminal()
	}
	return k, err
}

// tag finds the internal tag of an object. Its value must be a string naming
// a variant.
func (d *Decoder) tag(ms []jsonMember, tag, obj string, names []string) (int, error) {
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

func (d *Decoder) decodeSpanStart() error {
	e := &d.SpanStart
	*e = SpanStartEvent{Step: StepNone}
	f := fields{obj: "span_start"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "id":
			if err = f.first(0, k); err == nil {
				e.ID, err = getStr(f.obj, k, m.val)
			}
		case "name":
			if err = f.first(1, k); err == nil {
				e.Name, err = getStr(f.obj, k, m.val)
			}
		case "start_ns":
			if err = f.first(2, k); err == nil {
				e.Start, err = getU64(f.obj, k, m.val)
			}
		case "span_kind":
			if err = f.first(3, k); err == nil {
				e.SpanKind, err = d.sc.getEnum(f.obj, k, m.val, traceformat.SpanKinds)
			}
		case "parent_id":
			if err = f.first(4, k); err == nil {
				e.Parent, e.HasParent, err = getOptStr(f.obj, k, m.val)
			}
		case "measured":
			if err = f.first(5, k); err == nil {
				e.Measured, err = getBool(f.obj, k, m.val)
			}
		case "step":
			if err = f.first(6, k); err == nil && m.val.kind != jNull {
				e.Step, err = d.sc.getEnum(f.obj, k, m.val, traceformat.Steps)
			}
		case "tid":
			// Ours and unknown to candle-graph: never an error.
			if n, ok := ParseU64(m.val.raw); m.val.kind == jNumber && ok {
				e.TID, e.HasTID = n, true
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("id", "name", "start_ns", "span_kind")
}

func (d *Decoder) decodeSpanEnd() error {
	e := &d.SpanEnd
	*e = SpanEndEvent{}
	f := fields{obj: "span_end"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "id":
			if err = f.first(0, k); err == nil {
				e.ID, err = getStr(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(1, k); err == nil {
				e.Duration, err = getU64(f.obj, k, m.val)
			}
		case "tracer_ns": // ours: candle-graph ignores it, and so does a reader when it is no u64
			e.Tracer, e.HasTracer = ParseU64(m.val.raw)
			e.HasTracer = e.HasTracer && m.val.kind == jNumber
		}
		if err != nil {
			return err
		}
	}
	return f.require("id")
}

func (d *Decoder) decodeOp() error {
	e := &d.Op
	*e = OpEvent{Inputs: e.Inputs[:0], Shape: e.Shape[:0]}
	f := fields{obj: "op"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.SpanID, err = getStr(f.obj, k, m.val)
			}
		case "op_name":
			if err = f.first(1, k); err == nil {
				e.OpName, err = getStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(2, k); err == nil {
				e.Shape, err = d.sc.getU64List(f.obj, k, m.val, e.Shape)
			}
		case "dtype":
			if err = f.first(3, k); err == nil {
				e.Dtype, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(4, k); err == nil {
				e.Device, err = getStr(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(5, k); err == nil {
				e.Duration, err = getU64(f.obj, k, m.val)
			}
		case "input_dense_bytes":
			if err = f.first(6, k); err == nil {
				e.InBytes, err = getU64(f.obj, k, m.val)
			}
		case "inputs":
			if err = f.first(7, k); err == nil {
				e.Inputs, err = d.sc.getStrList(f.obj, k, m.val, e.Inputs)
			}
		case "output":
			if err = f.first(8, k); err == nil {
				e.Output, e.HasOutput, err = getOptStr(f.obj, k, m.val)
			}
		case "timestamp_ns":
			if err = f.first(9, k); err == nil {
				e.Timestamp, err = getU64(f.obj, k, m.val)
			}
		case "output_dense_bytes":
			if err = f.first(10, k); err == nil {
				e.OutBytes, e.HasOutBytes, err = getOptU64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "op_name", "shape", "dtype", "device", "duration_ns", "input_dense_bytes")
}

func (d *Decoder) decodeTensor() error {
	e := &d.Tensor
	*e = TensorEvent{shape: e.shape[:0], category: categoryOther}
	f := fields{obj: "tensor"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.SpanID, err = getStr(f.obj, k, m.val)
			}
		case "tensor_id":
			if err = f.first(1, k); err == nil {
				e.TensorID, err = getStr(f.obj, k, m.val)
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
				e.category, err = d.sc.getEnum(f.obj, k, m.val, traceformat.Categories)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "tensor_id", "shape", "dtype", "device")
}

func (d *Decoder) decodeTensorStats() error {
	e := &d.TensorStats
	*e = TensorStatsEvent{Shape: e.Shape[:0]}
	f := fields{obj: "tensor_stats"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.SpanID, err = getStr(f.obj, k, m.val)
			}
		case "label":
			if err = f.first(1, k); err == nil {
				e.Label, err = getStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(2, k); err == nil {
				e.Shape, err = d.sc.getU64List(f.obj, k, m.val, e.Shape)
			}
		case "dtype":
			if err = f.first(3, k); err == nil {
				e.Dtype, err = getStr(f.obj, k, m.val)
			}
		case "elements":
			if err = f.first(4, k); err == nil {
				e.Elements, err = getU64(f.obj, k, m.val)
			}
		case "non_finite":
			if err = f.first(5, k); err == nil {
				e.NonFinite, err = getU64(f.obj, k, m.val)
			}
		case "rms":
			if err = f.first(6, k); err == nil {
				e.RMS, err = getF64(f.obj, k, m.val)
			}
		case "abs_max":
			if err = f.first(7, k); err == nil {
				e.AbsMax, err = getF64(f.obj, k, m.val)
			}
		case "mean":
			if err = f.first(8, k); err == nil {
				e.Mean, err = getF64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "label", "shape", "dtype", "elements", "non_finite", "rms", "abs_max", "mean")
}

func (d *Decoder) decodeMemory() error {
	e := &d.Memory
	*e = MemoryEvent{shape: e.shape[:0], Category: categoryOther}
	f := fields{obj: "memory"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "timestamp_ns":
			if err = f.first(0, k); err == nil {
				e.Timestamp, err = getU64(f.obj, k, m.val)
			}
		case "storage_id":
			if err = f.first(1, k); err == nil {
				e.StorageID, err = getStr(f.obj, k, m.val)
			}
		case "tensor_id":
			if err = f.first(2, k); err == nil {
				e.TensorID, err = getStr(f.obj, k, m.val)
			}
		case "span_id":
			if err = f.first(3, k); err == nil {
				e.SpanID, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(4, k); err == nil {
				e.Device, err = getStr(f.obj, k, m.val)
			}
		case "bytes":
			if err = f.first(5, k); err == nil {
				e.Bytes, err = getU64(f.obj, k, m.val)
			}
		case "action":
			if err = f.first(6, k); err == nil {
				e.Action, err = d.sc.getEnum(f.obj, k, m.val, traceformat.MemoryActions)
			}
		case "dtype":
			if err = f.first(7, k); err == nil {
				e.dtype, err = getStr(f.obj, k, m.val)
			}
		case "op_name":
			if err = f.first(8, k); err == nil {
				e.OpName, e.HasOpName, err = getOptStr(f.obj, k, m.val)
			}
		case "shape":
			if err = f.first(9, k); err == nil {
				e.shape, err = d.sc.getU64List(f.obj, k, m.val, e.shape)
			}
		case "category":
			if err = f.first(10, k); err == nil {
				e.Category, err = d.sc.getEnum(f.obj, k, m.val, traceformat.Categories)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("timestamp_ns", "storage_id", "tensor_id", "span_id", "device", "bytes", "action", "dtype")
}

func (d *Decoder) decodeDeviceMemory() error {
	e := &d.DeviceMemory
	*e = DeviceMemoryEvent{}
	f := fields{obj: "device_memory"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "timestamp_ns":
			if err = f.first(0, k); err == nil {
				e.Timestamp, err = getU64(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(1, k); err == nil {
				e.Device, err = getStr(f.obj, k, m.val)
			}
		case "used_bytes":
			if err = f.first(2, k); err == nil {
				e.Used, e.HasUsed, err = getOptU64(f.obj, k, m.val)
			}
		case "free_bytes":
			if err = f.first(3, k); err == nil {
				e.Free, e.HasFree, err = getOptU64(f.obj, k, m.val)
			}
		case "reserved_bytes":
			if err = f.first(4, k); err == nil {
				e.Reserved, e.HasReserved, err = getOptU64(f.obj, k, m.val)
			}
		case "capacity_bytes":
			if err = f.first(5, k); err == nil {
				e.Capacity, e.HasCapacity, err = getOptU64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("timestamp_ns", "device")
}

func (d *Decoder) decodeDeviceInterval() error {
	e := &d.DeviceInterval
	*e = DeviceIntervalEvent{}
	f := fields{obj: "device_interval"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "span_id":
			if err = f.first(0, k); err == nil {
				e.SpanID, err = getStr(f.obj, k, m.val)
			}
		case "device":
			if err = f.first(1, k); err == nil {
				e.Device, err = getStr(f.obj, k, m.val)
			}
		case "stream_id":
			if err = f.first(2, k); err == nil {
				e.StreamID, err = getStr(f.obj, k, m.val)
			}
		case "clock_id":
			if err = f.first(3, k); err == nil {
				e.ClockID, err = getStr(f.obj, k, m.val)
			}
		case "backend":
			if err = f.first(4, k); err == nil {
				e.Backend, err = getStr(f.obj, k, m.val)
			}
		case "start_ns":
			if err = f.first(5, k); err == nil {
				e.Start, err = getU64(f.obj, k, m.val)
			}
		case "duration_ns":
			if err = f.first(6, k); err == nil {
				e.Duration, err = getU64(f.obj, k, m.val)
			}
		case "name":
			// Ours and unknown to candle-graph: never an error.
			if m.val.kind == jString {
				e.Name = m.val.raw
			}
		case "correlation_id":
			// Ours too: kept when it is an unsigned integer, else ignored.
			if v, cerr := getU64(f.obj, k, m.val); cerr == nil {
				e.Correlation, e.HasCorrelation = v, true
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("span_id", "device", "stream_id", "clock_id", "backend", "start_ns", "duration_ns")
}

func (d *Decoder) decodeGradient() error {
	e := &d.Gradient
	*e = GradientEvent{}
	f := fields{obj: "gradient"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "event_id":
			if err = f.first(0, k); err == nil {
				e.EventID, err = getStr(f.obj, k, m.val)
			}
		case "root":
			if err = f.first(1, k); err == nil {
				e.Root, err = getStr(f.obj, k, m.val)
			}
		case "key":
			if err = f.first(2, k); err == nil {
				e.Key, err = getStr(f.obj, k, m.val)
			}
		case "state":
			if err = f.first(3, k); err == nil {
				e.State, err = d.sc.getEnum(f.obj, k, m.val, traceformat.GradientStates)
			}
		case "norm":
			if err = f.first(4, k); err == nil {
				e.Norm, e.HasNorm, err = getOptF64(f.obj, k, m.val)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("event_id", "root", "key", "state")
}

func (d *Decoder) decodeEdge() error {
	e := &d.Edge
	*e = EdgeEvent{}
	ek, err := d.tag(d.members, "edge_kind", "edge", traceformat.EdgeKinds)
	if err != nil {
		return err
	}
	e.Call = ek == 0
	f := fields{obj: "edge"}
	for _, m := range d.members {
		k := keyOf(m.key)
		if e.Call {
			switch k {
			case "from_span":
				if err = f.first(0, k); err == nil {
					e.From, err = getStr(f.obj, k, m.val)
				}
			case "to_span":
				if err = f.first(1, k); err == nil {
					e.To, err = getStr(f.obj, k, m.val)
				}
			case "host_duration_ns":
				if err = f.first(2, k); err == nil {
					e.HostDuration, err = getU64(f.obj, k, m.val)
				}
			}
		} else {
			switch k {
			case "from_tensor":
				if err = f.first(0, k); err == nil {
					e.From, err = getStr(f.obj, k, m.val)
				}
			case "to_tensor":
				if err = f.first(1, k); err == nil {
					e.To, err = getStr(f.obj, k, m.val)
				}
			}
		}
		if err != nil {
			return err
		}
	}
	if e.Call {
		return f.require("from_span", "to_span", "host_duration_ns")
	}
	return f.require("from_tensor", "to_tensor")
}

func (d *Decoder) decodeTerminal() error {
	e := &d.Terminal
	*e = terminalEvent{}
	f := fields{obj: "terminal"}
	var err error
	for _, m := range d.members {
		switch k := keyOf(m.key); k {
		case "outcome":
			if err = f.first(0, k); err == nil {
				e.Outcome, err = d.sc.getEnum(f.obj, k, m.val, traceformat.Outcomes)
			}
		case "timestamp_ns":
			if err = f.first(1, k); err == nil {
				e.Timestamp, err = getU64(f.obj, k, m.val)
			}
		case "reason":
			if err = f.first(2, k); err == nil {
				e.Reason, e.HasReason, err = getOptStr(f.obj, k, m.val)
			}
		case "tracer_ns": // ours, as on span_end
			e.Tracer, e.HasTracer = ParseU64(m.val.raw)
			e.HasTracer = e.HasTracer && m.val.kind == jNumber
		case "tracer_estimated_ns":
			if m.val.kind == jNumber {
				e.Estimated, _ = ParseU64(m.val.raw)
			}
		}
		if err != nil {
			return err
		}
	}
	return f.require("outcome", "timestamp_ns")
}
