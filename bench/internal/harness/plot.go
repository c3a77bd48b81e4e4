package harness

import (
	"fmt"
	"image/color"
	"math"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Palette holds well-separated colours (Okabe–Ito plus extras).
var Palette = []color.RGBA{
	{0, 114, 178, 255},   // blue
	{213, 94, 0, 255},    // vermillion
	{0, 158, 115, 255},   // green
	{204, 121, 167, 255}, // purple
	{230, 159, 0, 255},   // orange
	{86, 180, 233, 255},  // sky
	{120, 120, 120, 255}, // grey
	{0, 0, 0, 255},       // black
	{160, 82, 45, 255},   // brown
	{240, 228, 66, 255},  // yellow
}

// SystemColor gives each system the same colour in every plot.
func SystemColor(system string) color.Color {
	i := SystemOrder(system)
	return Palette[i%len(Palette)]
}

func NewPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = vg.Points(13)
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.TextStyle.Font.Size = vg.Points(10)
	p.Add(plotter.NewGrid())
	return p
}

// LogAxis turns the Y axis logarithmic between lo and hi.
func LogAxis(p *plot.Plot, lo, hi float64) {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ReadableLogTicks{}
	p.Y.Min, p.Y.Max = lo, hi
}

// ReadableLogTicks labels powers of ten as plain numbers.
type ReadableLogTicks struct{}

func (ReadableLogTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		v := math.Pow(10, e)
		if v >= min && v <= max {
			ts = append(ts, plot.Tick{Value: v, Label: TrimFloat(v)})
		}
		for k := 2.0; k < 10; k++ {
			if w := k * v; w >= min && w <= max {
				label := ""
				if k == 2 || k == 5 {
					label = TrimFloat(w)
				}
				ts = append(ts, plot.Tick{Value: w, Label: label})
			}
		}
	}
	return ts
}

func TrimFloat(v float64) string {
	s := fmt.Sprintf("%g", v)
	return s
}

// LogBars is a bar chart whose bars start at Floor, for log axes.
type LogBars struct {
	Values []float64
	Floor  float64
	Width  vg.Length
	Offset vg.Length
	Color  color.Color
}

func (b *LogBars) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	for i, v := range b.Values {
		if math.IsNaN(v) {
			continue
		}
		x := trX(float64(i)) - b.Width/2 + b.Offset
		top := trY(math.Max(v, b.Floor))
		bottom := trY(b.Floor)
		pts := []vg.Point{{X: x, Y: bottom}, {X: x, Y: top}, {X: x + b.Width, Y: top}, {X: x + b.Width, Y: bottom}}
		c.FillPolygon(b.Color, c.ClipPolygonY(pts))
	}
}

func (b *LogBars) DataRange() (xmin, xmax, ymin, ymax float64) {
	ymin, ymax = b.Floor, b.Floor
	for _, v := range b.Values {
		if !math.IsNaN(v) {
			ymax = math.Max(ymax, v)
		}
	}
	return 0, float64(len(b.Values) - 1), ymin, ymax
}

func (b *LogBars) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Min.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Max.X, Y: c.Min.Y}}
	c.FillPolygon(b.Color, c.ClipPolygonY(pts))
}

// CategoryAxis labels X positions 0..n-1 with names.
func CategoryAxis(p *plot.Plot, names []string) {
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.6, float64(len(names))-0.4
}

func FloorPow10(v float64) float64 {
	if math.IsInf(v, 0) || v <= 0 {
		return 0.01
	}
	return math.Max(math.Pow(10, math.Floor(math.Log10(v))), 0.001)
}

func CeilPow10(v float64) float64 {
	if v <= 0 {
		return 1
	}
	return math.Pow(10, math.Ceil(math.Log10(v)+1e-9))
}

// OrderedLabels returns the distinct labels of xs in first-seen order.
func OrderedLabels[T any](xs []T, label func(T) string) []string {
	var out []string
	for _, x := range xs {
		if l := label(x); !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// GroupedBars adds one bar series per name to p over len(categories)
// categories; values[j][i] is series j's value in category i (NaN: no bar).
func GroupedBars(p *plot.Plot, categories, names []string, colors []color.Color, values [][]float64) error {
	w := vg.Points(min(24, 160/float64(max(1, len(names)))))
	for j, name := range names {
		vals := make(plotter.Values, len(categories))
		for i := range categories {
			if v := values[j][i]; !math.IsNaN(v) {
				vals[i] = v
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Offset = w * vg.Length(float64(j)-float64(len(names)-1)/2)
		bars.Color = colors[j%len(colors)]
		bars.LineStyle.Width = 0
		p.Add(bars)
		p.Legend.Add(name, bars)
	}
	CategoryAxis(p, categories)
	p.Y.Min = 0
	return nil
}

// SecondTicks labels a time axis every 1, 2 or 5 s.
type SecondTicks struct{}

func (SecondTicks) Ticks(min, max float64) []plot.Tick {
	step := 1.0
	for _, st := range []float64{1, 2, 5, 10, 20, 30, 60} {
		step = st
		if (max-min)/st <= 12 {
			break
		}
	}
	var ts []plot.Tick
	for v := math.Ceil(min/step) * step; v <= max; v += step {
		ts = append(ts, plot.Tick{Value: v, Label: TrimFloat(v)})
	}
	return ts
}
