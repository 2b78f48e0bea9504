// Python's strftime for chat templates (transformers' strftime_now, which Llama 3.x templates call for the date).

const DAYS = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];
const MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];

/**
 * Python's date.strftime in the C locale, with glibc's flags (%-d: no padding, %_d: spaces): %a %A %b %B %d %e %H %I
 * %j %m %M %p %S %y %Y %%; any other directive stays as written.
 */
export function pyStrftime(date: Date, format: string): string {
  const startOfYear = new Date(date.getFullYear(), 0, 1);
  const dayOfYear = Math.round((new Date(date.getFullYear(), date.getMonth(), date.getDate()).getTime() - startOfYear.getTime()) / 86_400_000) + 1;
  return format.replace(/%([-_0]?)([a-zA-Z%])/g, (whole, flag: string, d: string) => {
    const num = (n: number, width = 2, padChar = "0") => {
      const p = flag === "-" ? "" : flag === "_" ? " " : flag === "0" ? "0" : padChar;
      return p === "" ? String(n) : String(n).padStart(width, p);
    };
    switch (d) {
      case "a":
        return DAYS[date.getDay()]!.slice(0, 3);
      case "A":
        return DAYS[date.getDay()]!;
      case "b":
      case "h":
        return MONTHS[date.getMonth()]!.slice(0, 3);
      case "B":
        return MONTHS[date.getMonth()]!;
      case "d":
        return num(date.getDate());
      case "e":
        return num(date.getDate(), 2, " ");
      case "H":
        return num(date.getHours());
      case "I":
        return num(date.getHours() % 12 || 12);
      case "j":
        return num(dayOfYear, 3);
      case "m":
        return num(date.getMonth() + 1);
      case "M":
        return num(date.getMinutes());
      case "p":
        return date.getHours() < 12 ? "AM" : "PM";
      case "S":
        return num(date.getSeconds());
      case "y":
        return num(date.getFullYear() % 100);
      case "Y":
        return String(date.getFullYear());
      case "%":
        return "%";
      default:
        return whole;
    }
  });
}
